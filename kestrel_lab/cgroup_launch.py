"""``python cgroup_launch.py CGROUP_PROCS CMD [ARG …]``: join a cgroup, then become CMD.

The child ``cgroup.run`` starts: it writes its own PID into the cgroup's ``cgroup.procs`` (so everything
it does from then on is charged to that cgroup) and ``exec``s the command in its place. Run by path, not
as ``-m kestrel_lab…``: importing the package would set numba's variables in the command's environment
and charge the import's memory to the cgroup.
"""
import os
import sys


def main(argv: list[str]) -> None:
    procs, cmd = argv[0], argv[1:]
    with open(procs, "w") as f:
        f.write(str(os.getpid()))
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        sys.exit(f"cannot run {cmd[0]}: {e.strerror}")


if __name__ == "__main__":
    main(sys.argv[1:])
