"""The Python sessions of the documentation's pages, each page in an interpreter of its own.

``tests/test_docs.py`` starts this once (twice: once with ``--torch``, for the pages that
need PyTorch, which is then imported first): it listens on a Unix socket and forks a child
for each page that connects, so that a page's sessions start from an interpreter no other
page has touched without each paying for importing torch.
A page sends its folder and environment, then each ``>>>`` block as a JSON line; the doctest
report of each (empty where the block printed what the page shows) comes back as a JSON line.
The blocks of a page share their variables, as a reader's interpreter does, and the child
starts as ``python`` would in the page's folder: that folder first on the import path.
"""

from __future__ import annotations

import contextlib
import doctest
import io
import json
import os
import socketserver
import sys


class Page(socketserver.StreamRequestHandler):
    """One page's sessions, in the child forked for it."""

    def handle(self) -> None:
        start = json.loads(self.rfile.readline())
        os.chdir(start["folder"])
        os.environ.clear()
        os.environ.update(start["environ"])
        sys.path[0] = start["folder"]
        parser = doctest.DocTestParser()
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        scope: dict[str, object] = {"__name__": "__main__"}
        for line in self.rfile:
            block = json.loads(line)
            test = parser.get_doctest(
                block["source"], scope, block["page"], block["page"], block["line"]
            )
            report = io.StringIO()
            runner.run(test, out=report.write, clear_globs=False)
            scope.update(test.globs)
            self.wfile.write((json.dumps({"report": report.getvalue()}) + "\n").encode())
            self.wfile.flush()


class Server(socketserver.ForkingMixIn, socketserver.UnixStreamServer):
    pass


def main() -> None:
    socket_path = sys.argv[1]
    if "--torch" in sys.argv[2:]:
        # What those pages import: paid once here, not once a page.
        with contextlib.suppress(ImportError):
            import torch._dynamo  # noqa: F401
    server = Server(socket_path, Page)
    print("ready", flush=True)
    # What the sessions print outside doctest's capture (C code, a subprocess) goes to
    # stderr, never into the answer above.
    os.dup2(2, 1)
    server.serve_forever()


if __name__ == "__main__":
    main()
