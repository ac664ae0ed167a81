"""One page's Python sessions, run one after the other in this fresh interpreter.

``tests/test_docs.py`` starts it in the folder the page sets up and sends each ``>>>`` block
as a JSON line on stdin; the doctest report of each (empty where the block printed what the
page shows) comes back as a JSON line. The blocks share their variables, as a reader's
interpreter does. This interpreter starts as ``python`` would in that folder: the folder
first on the import path.
"""

from __future__ import annotations

import doctest
import io
import json
import os
import sys


def main() -> None:
    # Answers go on the original stdout; whatever else writes to it (C code, a
    # subprocess) goes to stderr instead, where it cannot break an answer.
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.path[0] = os.getcwd()
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    scope: dict[str, object] = {"__name__": "__main__"}
    for line in sys.stdin:
        block = json.loads(line)
        test = parser.get_doctest(
            block["source"], scope, block["page"], block["page"], block["line"]
        )
        report = io.StringIO()
        runner.run(test, out=report.write, clear_globs=False)
        scope.update(test.globs)
        answers.write(json.dumps({"report": report.getvalue()}) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
