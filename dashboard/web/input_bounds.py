"""Input no column can hold, refused with a 400 (or a 404 for an id) naming the field, before any
view runs: every page, the read API and admin alike.

Why: PostgreSQL's text cannot hold a NUL byte and its integers end at 2^31 - 1 (ranks) or 2^63 - 1
(ids); a query, filter or insert with such a value failed in the database, as a 500 (a NUL in a
query parameter gave 8 of them). A JSON body's fields are checked where it is parsed
(`dashboard.web.api`); form fields by the forms themselves (Django's CharField refuses NUL).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from django.http import HttpRequest, HttpResponse, JsonResponse

INT_MAX = 2**31 - 1  # PositiveIntegerField: ranks
BIGINT_MAX = 2**63 - 1  # BigAutoField: every id
INTEGER_BOUNDS = {"rank": INT_MAX}  # path parameters held by a narrower column than an id


def refusal(status: int, message: str, field: str) -> JsonResponse:
    """The read API's and the agents' door's error shape: `{"error", "path"}`."""
    return JsonResponse({"error": message, "path": field}, status=status)


def nul_field(items: Iterable[tuple[str, str]]) -> str | None:
    """The first field whose name or value has a NUL byte."""
    for name, value in items:
        if "\x00" in name or "\x00" in value:
            return name.replace("\x00", "\\u0000")
    return None


def json_nul(value: object) -> str | None:
    """The path (`a.b[0]`) of the first string of a parsed JSON document with a NUL byte, in a key
    or a value (walked without recursion: a document may be as deep as the parser allows)."""
    todo: list[tuple[str, object]] = [("body", value)]
    while todo:
        path, item = todo.pop()
        if isinstance(item, str) and "\x00" in item:
            return path.removeprefix("body.")
        if isinstance(item, dict):
            for key, inner in item.items():
                if "\x00" in key:
                    return path.removeprefix("body.")
                todo.append((f"{path}.{key}", inner))
        elif isinstance(item, list):
            todo.extend((f"{path}[{i}]", inner) for i, inner in enumerate(item))
    return None


class InputBounds:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        found = nul_field(request.COOKIES.items())  # before the session middleware looks its cookie up
        if found is not None:
            return refusal(400, f"cookie {found} contains a NUL byte", found)
        return self.get_response(request)

    def process_view(
        self,
        request: HttpRequest,
        view: Callable[..., HttpResponse],
        args: tuple[object, ...],
        kwargs: dict[str, object],
    ) -> HttpResponse | None:
        for name, value in kwargs.items():
            if isinstance(value, int) and value > INTEGER_BOUNDS.get(name, BIGINT_MAX):
                return refusal(404, f"no {name.removesuffix('_id')} {value}", name)
        fields = [(name, value) for name, value in kwargs.items() if isinstance(value, str)]
        fields += [(name, value) for name, values in request.GET.lists() for value in values]
        if request.content_type == "application/x-www-form-urlencoded":
            fields += [(name, value) for name, values in request.POST.lists() for value in values]
        found = nul_field(fields)
        if found is not None:
            return refusal(400, f"{found} contains a NUL byte", found)
        return None
