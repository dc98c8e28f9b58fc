"""The kernel's rules for set-user-ID and set-group-ID bits, as cases.

`modes.py setup DIR` (as root) makes one file or directory per case under
DIR/m, owned and moded as the case says. `modes.py act DIR ACTOR` (run by
the test as that actor's uid and gid, a process of its own) applies each of
that actor's operations to its case and prints `case errno`.
`modes.py actors` prints each actor's name, uid and gid.
`modes.py show DIR` prints `case mode uid gid` for every case. The test runs
the three on tmpfs and on leasefs and compares the lines.

Cases: operation x set-id bits x actor x file type.
"""
import errno
import os
import sys

OPS = ["chown-uid", "chown-gid", "chown-both", "chown-none", "chmod", "write", "truncate", "fallocate", "otrunc"]
# Name -> permission bits. Group-execute is off only where sgid means
# mandatory locking rather than set-group-ID.
SETID = {"suid": 0o4777, "sgid-gx": 0o2777, "sgid-nogx": 0o2767, "none": 0o777}
# Name -> (uid, gid of the process, (uid, gid) of the file).
ACTORS = {
    "root": (0, 0, (1000, 2000)),
    "owner-in-group": (1000, 1000, (1000, 1000)),
    "owner-not-in-group": (1000, 1000, (1000, 2000)),
    "other-writer": (1001, 1001, (1000, 2000)),
}
TYPES = ["file", "dir"]


def cases():
    for op in OPS:
        for setid in SETID:
            for actor in ACTORS:
                for kind in TYPES:
                    yield op, setid, actor, kind


def name(op, setid, actor, kind):
    return f"{op}.{setid}.{actor}.{kind}"


def setup(root):
    base = os.path.join(root, "m")
    os.mkdir(base)
    os.chmod(base, 0o777)
    for op, setid, actor, kind in cases():
        p = os.path.join(base, name(op, setid, actor, kind))
        if kind == "dir":
            os.mkdir(p)
        else:
            with open(p, "w") as f:
                f.write("0123456789")
        uid, gid = ACTORS[actor][2]
        os.chown(p, uid, gid)
        # chmod after chown: a chown would clear the bits.
        os.chmod(p, SETID[setid])


def chown_target(actor, what):
    """The ids each actor asks for: root gives the file away; the others
    ask for their own ids (allowed to the owner, refused to anyone else)."""
    if actor == "root":
        uid, gid = 1001, 3000
    else:
        uid, gid = ACTORS[actor][0], ACTORS[actor][1]
    return {"chown-uid": (uid, -1), "chown-gid": (-1, gid), "chown-both": (uid, gid), "chown-none": (-1, -1)}[what]


def act(root, actor):
    base = os.path.join(root, "m")
    for op, setid, who, kind in cases():
        if who != actor:
            continue
        n = name(op, setid, who, kind)
        p = os.path.join(base, n)
        try:
            if op.startswith("chown"):
                uid, gid = chown_target(actor, op)
                os.chown(p, uid, gid)
            elif op == "chmod":
                os.chmod(p, SETID[setid])
            elif op == "write":
                fd = os.open(p, os.O_WRONLY)
                try:
                    os.write(fd, b"x")
                finally:
                    os.close(fd)
            elif op == "truncate":
                os.truncate(p, 3)
            elif op == "fallocate":
                fd = os.open(p, os.O_WRONLY)
                try:
                    os.posix_fallocate(fd, 0, 8192)
                finally:
                    os.close(fd)
            elif op == "otrunc":
                os.close(os.open(p, os.O_WRONLY | os.O_TRUNC))
            print(n, "ok")
        except OSError as e:
            print(n, errno.errorcode.get(e.errno, e.errno))


def show(root):
    base = os.path.join(root, "m")
    for c in cases():
        n = name(*c)
        s = os.lstat(os.path.join(base, n))
        print(n, oct(s.st_mode), s.st_uid, s.st_gid)


if __name__ == "__main__":
    what, root = sys.argv[1], sys.argv[2:3]
    root = root[0] if root else None
    if what == "actors":
        for actor, (uid, gid, _) in ACTORS.items():
            print(actor, uid, gid)
    elif what == "setup":
        setup(root)
    elif what == "act":
        act(root, sys.argv[3])
    elif what == "show":
        show(root)
    else:
        sys.exit(f"modes.py: unknown command {what}")
