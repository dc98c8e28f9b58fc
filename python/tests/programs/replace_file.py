"""Replace a file's contents the classic way: write a temporary file, then
rename it over the name; with --fsync, sync the file before the rename and
the directory after it (what POSIX needs for the new contents to survive a
power cut).

usage: replace_file.py NAME TEXT [--fsync]
"""
import os
import sys

name, text = sys.argv[1], sys.argv[2].encode()
sync = "--fsync" in sys.argv[3:]
tmp = name + ".tmp"
fd = os.open(tmp, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
os.write(fd, text)
if sync:
    os.fsync(fd)
os.close(fd)
os.rename(tmp, name)
if sync:
    d = os.open(os.path.dirname(os.path.abspath(name)), os.O_RDONLY)
    os.fsync(d)
    os.close(d)
print("replaced")
