"""``python -m torch_backend_registry``: the torch-backends command."""

from __future__ import annotations

import sys

from ._cli import main

if __name__ == "__main__":
    sys.exit(main())
