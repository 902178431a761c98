"""The one error type that crosses layers: it carries an HTTP status and the offending field."""

from __future__ import annotations


class ParrotError(Exception):
    """An error a user can act on.

    `status` is the HTTP status the edge answers with (4xx: the caller's fault; 5xx: ours);
    `field` names the request field at fault, when there is one.
    """

    def __init__(
        self, message: str, *, status: int = 400, field: str | None = None, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.field = field
        self.retry_after_s = retry_after_s  # a 429/503 that will pass: when to try again (Retry-After)

    def to_dict(self) -> dict[str, object]:
        return {"error": {"message": self.message, "field": self.field, "status": self.status}}

    @classmethod
    def from_dict(cls, body: dict[str, object], status: int) -> ParrotError:
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict):
            field = err.get("field")
            return cls(str(err.get("message")), status=status, field=str(field) if field else None)
        detail = body.get("detail") if isinstance(body, dict) else body
        return cls(str(detail), status=status)


def not_found(what: str, ident: object, field: str | None = None) -> ParrotError:
    return ParrotError(f"unknown {what} {ident!r}", status=404, field=field)


def conflict(message: str, field: str | None = None) -> ParrotError:
    return ParrotError(message, status=409, field=field)
