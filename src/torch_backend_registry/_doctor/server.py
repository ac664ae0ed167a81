"""Imported by doctor's forkserver alone, first of all: its own output goes to /dev/null.

The forkserver starts with the standard streams of the program that started it. Holding
them, it kept that program's pipe open after the program ended, while it tore PyTorch down
(``torch-backends doctor | tee`` waited seconds for it), and printed PyTorch's import
warnings a second time. A probe writes to a pipe of its own (:func:`.probe.main`). Never
import this module anywhere else.
"""

import os

_null = os.open(os.devnull, os.O_WRONLY)
for _fd in (1, 2):
    os.dup2(_null, _fd)
os.close(_null)
