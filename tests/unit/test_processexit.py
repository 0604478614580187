"""The launcher's process end (launcher/processexit.py): the status it reported, after what a
normal exit does first (threads that are not daemons, atexit callbacks, flushed streams), and
none of the interpreter's finalization, where a daemon thread in native code could abort the
process with 134 (CI 2026-12-07: field case C21's job recorded exit 134 for a reported 1)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent("""
    import atexit, os, sys, threading, time
    from monarch_operator.launcher.processexit import exit_process

    class Finalized:
        def __del__(self):
            os.write(1, b"finalized by the interpreter\\n")  # print may be gone by then

    kept = Finalized()
    atexit.register(lambda: print("atexit ran", flush=True))

    def slow():
        time.sleep(0.3)
        print("non-daemon thread done", flush=True)

    threading.Thread(target=slow).start()
    sys.stdout.write("final line, not flushed")
    exit_process(int(sys.argv[1]))
    print("returned")
""")


def run(code: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROGRAM, str(code)], capture_output=True,
                          text=True, timeout=60, check=False)


def test_exit_process_ends_with_the_status_after_threads_atexit_and_flush_only():
    done = run(3)
    assert done.returncode == 3, done
    # stdout is a pipe, so block-buffered: the final line shows only because it was flushed.
    assert "final line, not flushed" in done.stdout, done.stdout
    assert done.stdout.index("non-daemon thread done") < done.stdout.index("atexit ran"), done
    assert "finalized by the interpreter" not in done.stdout
    assert "returned" not in done.stdout
    assert done.stderr == ""


def test_a_zero_status_is_kept():
    assert run(0).returncode == 0


def test_the_console_scripts_end_through_exit_process():
    """``monarch-launch`` and ``monarch-torchrun`` as programs (argv None) end the process
    through :func:`exit_process` with the status they reported (a usage error here: 2)."""
    for entry, args in (("monarch_operator.launcher.cli", []),
                        ("monarch_operator.launcher.spmd_cli", ["--", "true"])):
        program = textwrap.dedent(f"""
            import os, sys
            os.environ["MONARCH_STOPGUARD"] = "0"
            from monarch_operator.launcher import processexit
            real = processexit.exit_process
            def traced(code):
                print("exit_process", code, flush=True)
                real(code)
            import {entry} as entry
            entry.exit_process = traced
            sys.argv = ["prog", "--hostfile", "/nonexistent/hostfile", *{args!r}]
            entry.main()
            print("main returned", flush=True)
        """)
        done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode == 2, (entry, done)
        assert "exit_process 2" in done.stdout and "main returned" not in done.stdout, (
            entry, done)
        assert "failed: --hostfile" in done.stderr, (entry, done)
