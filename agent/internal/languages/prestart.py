# A Python interpreter started ahead of one stateless run of codemode's
# runner, so that the run does not wait for the interpreter to start. It runs
# as `python3 -c` with this source, as the sandbox's user, and serves exactly
# one run; the runner's scrub kills it if no run takes it.
#
# It writes one byte to fd 4 and closes it once it is ready (initialised, with
# site imported), so that the runner only offers sandboxes whose interpreter
# is ready. The runner then writes one byte and then the run's UTF-8 source to fd 3 and
# closes it: "1" when the run has standard input (already on fd 0, a pipe),
# "0" when it has none (fd 0 then becomes /dev/null, as for a cold start).
#
# Everything else is as for `python3 -c SOURCE`: sys.argv is ["-c"], the
# source is compiled as "<string>", sys.path[0] is "" (the workspace), the
# namespace of __main__ holds nothing of this file, an uncaught exception
# prints its traceback (without this file's frame) and exits 1 (130 for
# KeyboardInterrupt), and SystemExit ends the interpreter as usual.


def _codemode_prestart():
    import os
    import sys

    os.write(4, b"r")
    os.close(4)
    chunks = []
    while True:
        b = os.read(3, 1 << 20)
        if not b:
            break
        chunks.append(b)
    os.close(3)
    data = b"".join(chunks)
    if data[:1] != b"1":
        fd = os.open(os.devnull, os.O_RDONLY)
        if fd != 0:
            os.dup2(fd, 0)
            os.close(fd)
    g = sys.modules["__main__"].__dict__
    del g["_codemode_prestart"]
    try:
        code = compile(data[1:], "<string>", "exec")
    except SyntaxError as e:
        e.__traceback__ = None
        sys.excepthook(type(e), e, None)
        sys.exit(1)
    try:
        exec(code, g)
    except SystemExit:
        raise
    except BaseException as e:
        e.__traceback__ = e.__traceback__.tb_next
        sys.excepthook(type(e), e, e.__traceback__)
        # An interpreter ends by SIGINT on an uncaught KeyboardInterrupt,
        # which the runner reports as 128+2.
        sys.exit(130 if isinstance(e, KeyboardInterrupt) else 1)


_codemode_prestart()
