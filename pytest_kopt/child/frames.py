"""Where an error in a harness process came from, as its user sees it: the traceback without the harness's own
frames, and the innermost frame of the user's files (the kernel's and the reference's folders) as the file and
line a report points at."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Iterable

#: The package whose frames a user never needs to read (kopt's harness and gates).
PACKAGE = Path(__file__).resolve().parent.parent


def _inside(filename: str, folder: Path) -> bool:
    try:
        Path(filename).resolve().relative_to(folder)
    except (ValueError, OSError):
        return False
    return True


def user_traceback(exc: BaseException, user_files: Iterable[str | None]) -> tuple[str, str | None, int | None]:
    """``exc``'s traceback (with the exceptions it was raised from) less the frames in kopt's package, and the file
    and line of its innermost frame in the folder of one of ``user_files`` (the kernel, the reference). The text is
    "" when every frame was kopt's (an error kopt decided, such as a shape that breaks the contract: its message says
    it all); file and line are None when no frame was the user's."""
    folders = {Path(f).resolve().parent for f in user_files if f}
    te = traceback.TracebackException.from_exception(exc)
    where: tuple[str | None, int | None] = (None, None)
    parts: list[str] = []
    chain: list[traceback.TracebackException] = []
    node: traceback.TracebackException | None = te
    while node is not None:
        chain.append(node)
        node = node.__cause__ or (None if node.__suppress_context__ else node.__context__)
    for link in reversed(chain):  # the first cause first, as Python prints them
        frames = [f for f in link.stack if not _inside(f.filename, PACKAGE)]
        for f in frames:
            if any(_inside(f.filename, d) for d in folders):
                where = (f.filename, f.lineno)
        if frames:
            parts.append("Traceback (most recent call last):\n" + "".join(traceback.StackSummary.from_list(
                frames).format()) + "".join(link.format_exception_only()))
    return "\n".join(parts), where[0], where[1]
