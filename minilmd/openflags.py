"""How a file another user may have made, or put a link, a FIFO or a terminal at, is opened: the one home of those
flags (tests/test_one_home_constants.py fails on O_NOFOLLOW and O_NONBLOCK spelled together anywhere else).
untrusted.py's readers, the locks, the logs and run.dir's reserve, dirfd's and dirtree's opens, perms' settling of a
new file's mode all open with them. Standard library only, as fdread.py: perms.py and dirtree.py, which sit below
untrusted.py, use them too.
"""
from __future__ import annotations

import os

NO_FOLLOW_NO_BLOCK = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
"""Every open of a file another user may have made, with its access mode (O_RDONLY: OPEN_FLAGS; a write's own
O_WRONLY, O_CREAT, O_APPEND): no link followed, never blocked on a FIFO, never a controlling terminal, never
inherited."""
OPEN_FLAGS = os.O_RDONLY | NO_FOLLOW_NO_BLOCK
"""A read-only open of such a file."""
