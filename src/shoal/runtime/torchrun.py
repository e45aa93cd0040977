"""torchrun, tied to the process that started it: ``python -m shoal.runtime.torchrun ARGS`` is
``torchrun ARGS``, except that it gets SIGTERM when its parent (``SHOAL_PARENT_PID``) ends, even
by SIGKILL, and stops its workers as it does on any SIGTERM; its workers, in turn, end when it
ends (``shoal.runtime.entry``)."""

from __future__ import annotations

import os
import signal
import sys

from shoal.runtime.supervise import die_with_parent


def main(argv: list[str] | None = None) -> None:
    parent = os.environ.get("SHOAL_PARENT_PID")
    if parent is not None:
        die_with_parent(signal.SIGTERM, int(parent))
    os.environ["SHOAL_PARENT_PID"] = str(os.getpid())  # what the workers watch
    from torch.distributed.run import main as torchrun

    torchrun(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
