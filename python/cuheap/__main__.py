# SPDX-License-Identifier: MIT
"""``python -m cuheap ARGS``: the cuheap command, as ``cuheap ARGS``."""
import os
import sys

from . import tool_path


def main():
    tool = tool_path()
    if tool is None:
        sys.stderr.write("cuheap: the cuheap command is not installed beside this Python "
                         "(pip install cuheap, or put it on PATH)\n")
        return 2
    os.execv(tool, [tool] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
