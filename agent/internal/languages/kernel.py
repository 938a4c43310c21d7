# The stateful Python kernel of codemode's runner. It runs as the sandbox's
# user and executes cells, one at a time, in one namespace, like a notebook
# kernel. The runner talks to it over a Unix stream socket on fd 3:
#
#   runner -> kernel: a 4-byte big-endian length, then that many bytes of
#                     UTF-8 source; the first bytes carry three file
#                     descriptors (SCM_RIGHTS) that become the cell's
#                     stdin, stdout and stderr.
#   kernel -> runner: a 4-byte big-endian signed exit code when the cell ends.
#
# SIGINT interrupts a running cell (KeyboardInterrupt, as in a notebook):
# the runner sends it when a run times out or is cancelled, so that the
# session keeps its state. Between cells SIGINT is ignored.
#
# Between cells fds 0, 1 and 2 are /dev/null, so the runner sees the end of
# a cell's output when the cell's pipes close.
import ast
import io
import linecache
import os
import signal
import socket
import struct
import sys
import traceback
import types


def _recv_exact(sock, n):
    chunks = []
    while n > 0:
        b = sock.recv(min(n, 1 << 20))
        if not b:
            raise EOFError
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def _exit_code(e):
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except Exception:
        pass
    return 1


def _print_exception(e):
    # Leave out the kernel's own frames (compiled as "<string>").
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
        tb = tb.tb_next
    traceback.print_exception(type(e), e, tb)


_in_cell = False


def _on_sigint(signum, frame):
    if _in_cell:
        raise KeyboardInterrupt


def _run_cell(ns, src, filename):
    global _in_cell
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    try:
        _in_cell = True
        try:
            tree = ast.parse(src, filename, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                # Like a notebook, show the value of a final expression.
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, filename, "exec", dont_inherit=True), ns)
            if last is not None:
                value = eval(compile(last, filename, "eval", dont_inherit=True), ns)
                if value is not None:
                    print(repr(value))
        finally:
            _in_cell = False
        return 0
    except SystemExit as e:
        return _exit_code(e)
    except BaseException as e:
        try:
            _print_exception(e)
        except Exception:
            pass
        return 1


def _set_stdio():
    sys.stdin = io.TextIOWrapper(
        io.BufferedReader(io.FileIO(0, "r", closefd=False)),
        encoding="utf-8", errors="surrogateescape")
    # Unbuffered, as with python3 -u: output streams as it is printed.
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False),
        encoding="utf-8", errors="surrogateescape", write_through=True)
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False),
        encoding="utf-8", errors="backslashreplace", write_through=True)


def _main():
    signal.signal(signal.SIGINT, _on_sigint)
    sock = socket.socket(fileno=3)
    devnull = os.open(os.devnull, os.O_RDWR)
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    ns = main.__dict__
    cell = 0
    while True:
        try:
            head, fds, _, _ = socket.recv_fds(sock, 4, 3)
            if not head:
                return
            if len(head) < 4:
                head += _recv_exact(sock, 4 - len(head))
            (n,) = struct.unpack(">I", head)
            src = _recv_exact(sock, n).decode("utf-8", "surrogateescape")
        except EOFError:
            return
        cell += 1
        for i, fd in enumerate(fds[:3]):
            os.dup2(fd, i)
        for fd in fds:
            os.close(fd)
        _set_stdio()
        # A cell may have replaced the handler; each cell starts with the
        # kernel's.
        signal.signal(signal.SIGINT, _on_sigint)
        code = _run_cell(ns, src, "<cell %d>" % cell)
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass
        for i in range(3):
            os.dup2(devnull, i)
        sock.sendall(struct.pack(">i", code))


_main()
