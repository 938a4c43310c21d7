# The preloaded parent of codemode's runner: a Python interpreter that has
# imported the modules model-written code imports most (numpy, pandas, ...)
# and forks one prestarted interpreter per stateless run, so that a run finds
# them imported instead of spending most of its time importing them. It never
# runs user code itself.
#
# The runner starts it as root in the user's group, with no supplementary
# group, no_new_privs and its own process group, in a sandbox just verified
# clean, with a SOCK_SEQPACKET socket on fd 3. It reads its settings from the
# socket (JSON), then before anything else makes its uids (real, effective,
# saved) (P, U, P): P is a uid of its own, U the user's. Having left uid 0 it
# holds no capability (checked). The user's processes (all uids U) can
# neither signal it (that needs their uid to be its real or saved uid) nor
# trace it or read its memory (that needs all three of its uids to be
# theirs), and the scrub's kill(-1) as the user does not reach it; its
# effective uid U is what lets a child become the user without privilege.
#
# Each fork request carries the new interpreter's fds 0-4 (standard input,
# output, error, the code's pipe, the ready pipe), or for a session's kernel
# (kernel.py) fds 0-3 (the last its socket). The child makes all its
# uids U, sets PR_SET_PDEATHSIG, makes itself dumpable again, takes a process
# group of its own, keeps only fds 0-4, enters the workspace, restores
# signal handling, touches what most runs touch of the parent's (copying it
# ahead of the run), reseeds the random generators that import time seeded,
# and runs the runner's prestart source (prestart.py) in a fresh __main__,
# which reports ready on fd 4 and runs the code read from fd 3 (or the
# kernel's source). The parent
# replies with the child's pid and, when it ends, with its wait status. A
# prestarted child reports its exit code itself just before it exits, on the
# abstract socket named "end" in the settings (_report_end).
#
# With "light" in the settings, it imports the light modules first and then
# forks the light parent, which holds only those (the ones that imported;
# none if none did): it takes fd 4 for its
# socket and light["end"] for its children's reports, sets
# PR_SET_PDEATHSIG, and goes on as the parent does from the end of the
# imports; the parent closes fd 4 and imports the rest. Its ready message
# names what a run forked from it finds without importing more ("names"),
# and the parent's gives the light parent's pid ("light").


def _codemode_zygote():
    import json
    import os
    import signal
    import select
    import socket
    import sys

    sock = socket.socket(fileno=3)
    cfg = json.loads(sock.recv(1 << 20))
    # The settings the runner gave this process alone (the languages
    # table's ParentEnv), read when it started: not for its children's eyes.
    for name in cfg.get("unset", ()):
        os.environ.pop(name, None)
    uid, gid, own = cfg["uid"], cfg["gid"], cfg["parent_uid"]
    os.setresgid(gid, gid, gid)
    # While it imports, its real uid is the user's too, so that the modules'
    # checks of access(2) (matplotlib's of its config directory) see what a
    # run would; no process of the user exists yet to signal it.
    os.setresuid(uid, uid, own)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("CapPrm:", "CapEff:", "CapAmb:")) and int(line.split()[1], 16) != 0:
                raise SystemExit("preloaded parent still holds capabilities: " + line.strip())
    if os.getresuid() != (uid, uid, own) or os.getresgid() != (gid, gid, gid) or os.getgroups():
        raise SystemExit("preloaded parent: unexpected credentials")
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
    # Not dumpable: its /proc files are root's, its memory unreadable.
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)

    # Imports resolve from the image only: not from the workspace ('' in
    # sys.path, the working directory), which the children get back.
    os.chdir("/")
    path0 = sys.path.pop(0) if sys.path and sys.path[0] == "" else None
    # The light parent's modules first; once they are imported, the light
    # parent is forked (see the top of this file).
    light = cfg.get("light") or {}
    first = [m for m in light.get("modules", ()) if m in cfg["modules"]]
    loaded, skipped, light_pid, is_light = [], {}, 0, False
    if light and not first:
        os.close(4)
    for name in first + [m for m in cfg["modules"] if m not in first]:
        try:
            __import__(name)
            loaded.append(name)
        except Exception as e:  # ImportError, or a module broken in the image
            skipped[name] = "%s: %s" % (type(e).__name__, e)
        if first and len(loaded) + len(skipped) == len(first):
            if loaded:
                main_pid = os.getpid()
                light_pid = os.fork()
                if light_pid == 0:
                    # The light parent: its own socket (fd 4) and end
                    # socket, and nothing more imported.
                    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
                    if os.getppid() != main_pid:
                        os._exit(1)
                    is_light = True
                    sock.close()
                    sock = socket.socket(fileno=4)
                    cfg["end"] = light["end"]
                    skipped = {}
                    break
            os.close(4)
            first = None
    _warm(sys.modules)
    if path0 is not None:
        sys.path.insert(0, path0)
    # Out of the user's reach from here on (see the top of this file).
    os.setresuid(own, uid, own)
    if os.getresuid() != (own, uid, own):
        raise SystemExit("preloaded parent: unexpected credentials")
    # Everything imported so far is left alone by the collector, so that a
    # child's collections neither walk it nor copy its pages.
    import gc

    gc.collect()
    gc.freeze()
    workspace = cfg["workspace"]

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    me = os.getpid()
    ready = {"ready": True, "modules": loaded, "skipped": skipped, "light": light_pid}
    if is_light:
        # What code forked from here finds without importing more (see the
        # languages table's ImportsOnly).
        top = {m.partition(".")[0] for m in sys.modules}
        ready["names"] = sorted(top.union(getattr(sys, "stdlib_module_names", ())))
    sock.send(json.dumps(ready).encode())

    while True:
        try:
            rl, _, _ = select.select([sock, wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in rl:
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                sock.send(json.dumps({"exit": pid, "status": status}).encode())
        if sock in rl:
            msg, fds, _, _ = socket.recv_fds(sock, 64, 8)
            if not msg:
                os._exit(0)  # the runner went away
            # "fork": a prestarted interpreter (fds 0-4); "kernel": a
            # session's kernel (fds 0-3).
            source, want = (cfg["kernel"], 4) if msg == b"kernel" else (cfg["prestart"], 5)
            if len(fds) != want:
                for fd in fds:
                    os.close(fd)
                sock.send(json.dumps({"error": "want %d fds, got %d" % (want, len(fds))}).encode())
                continue
            pid = os.fork()
            if pid == 0:
                break  # the child, below
            for fd in fds:
                os.close(fd)
            sock.send(json.dumps({"pid": pid}).encode())

    # The child: nothing of the loop above may run again.
    try:
        os.setresuid(uid, uid, uid)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != me:
            os._exit(1)
        libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        # fds 0-4 from what the runner sent; every other fd closed (the
        # socket, the wake pipe, the received copies).
        high = [os.dup(fd) for fd in fds]
        for i, fd in enumerate(high):
            os.dup2(fd, i)
        os.closerange(len(high), os.sysconf("SC_OPEN_MAX"))
        end = cfg["end"] if want == 5 else None
        os.chdir(workspace)
        _copy_ahead(sys.modules)
        _reseed(sys.modules)
    except BaseException:
        os._exit(1)
    main = type(sys)("__main__")
    main.__dict__.update(__builtins__=__builtins__, __loader__=__loader__, __spec__=None, __annotations__={})
    sys.modules["__main__"] = main
    g = main.__dict__
    try:
        exec(compile(source, "<string>", "exec"), g)
        code = 0
    except SystemExit as e:
        code = _exit_code(e)
    _finish(code, g, end)


def _exit_code(e):
    # As the interpreter turns an uncaught SystemExit into an exit status.
    import sys

    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    try:
        print(e.code, file=sys.stderr)
    except Exception:
        pass
    return 1


def _finish(code, g, end):
    # What an interpreter does when it ends, less the teardown of every
    # module, which in a process holding pandas and matplotlib costs a
    # quarter of a second under gVisor (most of it copying the parent's
    # pages it touches): wait for the run's threads, call its atexit hooks,
    # let go of its namespace (so that files it left open are flushed and
    # closed, and finalisers run), flush the standard streams, report the
    # end, exit.
    import atexit
    import gc
    import os
    import sys
    import threading

    try:
        threading._shutdown()
    except BaseException:
        pass
    atexit._run_exitfuncs()
    try:
        g.clear()
        gc.collect()
    except BaseException:
        pass
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except BaseException:
            pass
    _report_end(end, code)
    os._exit(code)


def _report_end(end, code):
    # The exit code, sent to the runner after closing the standard output
    # and error: under gVisor the parent learns that a forked child ended
    # tens of milliseconds after its _exit (the address space it shares
    # with the parent is released first), and the runner ends the run on
    # this instead (package preload's serveEnds). Never blocking: if the
    # runner does not take it at once, the run ends as before.
    import os
    import socket

    if end is None:
        return
    try:
        os.close(1)
        os.close(2)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.setblocking(False)
        s.connect("\0" + end)
        s.send(bytes((code & 0xFF,)))
    except OSError:
        pass


def _warm(modules):
    # Lazy initialisation every run of these modules would pay once:
    # matplotlib's backend and fonts, its PNG writer (Pillow's image
    # plugins, imported at the first save), pandas's groupby machinery.
    if "matplotlib.pyplot" in modules:
        try:
            import io

            plt = modules["matplotlib.pyplot"]
            fig = plt.figure()
            ax = fig.add_subplot()
            ax.plot([0, 1], [0, 1])
            ax.hist([0, 1, 1])
            ax.set_title("warm")
            fig.savefig(io.BytesIO(), format="png")
            plt.close("all")
        except Exception:
            pass
    if "pandas" in modules:
        try:
            pd = modules["pandas"]
            pd.DataFrame({"k": [1, 1, 2], "v": [1.0, 2.0, 3.0]}).groupby("k").v.describe()
        except Exception:
            pass


def _copy_ahead(modules):
    # A child's first touch of an object of the parent's copies the memory
    # under it (Python writes reference counts), and under gVisor each first
    # write copies 2 MiB. Touching here, before the child reports ready, what
    # most runs touch moves those copies off the run's path (the runner's
    # RATIONALE, "What a forked child pays under gVisor"): numpy's common
    # calls, and the logging handlers that logging.shutdown, an atexit hook,
    # takes one by one when the child ends. What the calls draw from numpy's
    # global generator is replaced by the reseed after.
    np = modules.get("numpy")
    if np is not None:
        try:
            a = np.random.rand(8, 8)
            np.linalg.eigvals(a @ a)
            np.random.randint(0, 10, 8)
            np.random.randn(8)
        except Exception:
            pass
    logging = modules.get("logging")
    try:
        for ref in list(getattr(logging, "_handlerList", ())):
            h = ref()
            if h is not None:
                h.acquire()
                h.release()
    except Exception:
        pass


def _reseed(modules):
    # random reseeds itself in a forked child (os.register_at_fork); numpy's
    # global RandomState does not. A numpy without numpy.random (an image's
    # broken copy, imported as a bare namespace package) has no state to
    # reseed; one whose seed() fails ends the child.
    import random

    random.seed()
    rnd = getattr(modules.get("numpy"), "random", None)
    if rnd is not None:
        rnd.seed()


_codemode_zygote()
