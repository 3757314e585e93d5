"""A stand-in for tqdm."""


class RecordedBar:
    """A stand-in for tqdm that keeps what a ranking tells its progress bar (:func:`ranking.progress_bar`)."""

    def __init__(self, made: list, *, total: int, desc: str | None, disable: bool | None, **_) -> None:
        self.total, self.desc, self.disable, self.done, self.closed = total, desc, disable, 0, False
        made.append(self)

    def update(self, pairs: int) -> None:
        self.done += pairs

    def close(self) -> None:
        self.closed = True
