"""The Python sessions of a documentation page, in a process of the page's own.

``tests/test_docs.py`` starts it through multiprocessing: for a page that needs PyTorch,
forked from the server of ``_forked.py``, which imported it once; for the others spawned, a
new interpreter in which nothing of the pages' is imported. It begins as ``python`` would in
the page's folder (see ``_forked.start``, and that folder first on the import path), then
runs each ``>>>`` block it is sent and answers with doctest's report of it: empty where the
block printed what the page shows. The blocks of a page share their variables, as a reader's
interpreter does. It ends when the other end of the pipe is closed.
"""

from __future__ import annotations

import doctest
import io
import sys
from multiprocessing.connection import Connection
from pathlib import Path

from . import _forked


def serve(connection: Connection, folder: Path, environ: dict[str, str]) -> None:
    _forked.start(folder, environ)
    sys.path.insert(0, str(folder))
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    scope: dict[str, object] = {"__name__": "__main__"}
    while True:
        try:
            source, page, line = connection.recv()
        except EOFError:
            return
        test = parser.get_doctest(source, scope, page, page, line)
        report = io.StringIO()
        runner.run(test, out=report.write, clear_globs=False)
        scope.update(test.globs)
        connection.send(report.getvalue())
