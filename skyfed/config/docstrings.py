"""Configuration fields as their source declares them: the annotation, the default and the
docstring (the string literal under the field), which the flags' help and the generated
reference both read, so a field is documented once, where it is declared."""

from __future__ import annotations

import ast
import functools
import inspect
import re
import textwrap
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FieldSource:
    """One field of a dataclass as written: ``name: annotation = value`` and its doc."""

    name: str
    annotation: str
    value: ast.expr | None
    doc: str


def declared_fields(node: ast.ClassDef) -> list[FieldSource]:
    """The annotated fields of a class body, each with the docstring under it ("" if none);
    ``ClassVar`` annotations are no fields."""
    fields = []
    for i, stmt in enumerate(node.body):
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        annotation = ast.unparse(stmt.annotation)
        if annotation.startswith(("ClassVar", "typing.ClassVar")):
            continue
        after = node.body[i + 1] if i + 1 < len(node.body) else None
        literal = after.value if isinstance(after, ast.Expr) else None
        doc = literal.value if isinstance(literal, ast.Constant) else ""
        fields.append(
            FieldSource(stmt.target.id, annotation, stmt.value, doc if isinstance(doc, str) else "")
        )
    return fields


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Each field of ``cls`` with its docstring, read from the class's source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    return {f.name: f.doc for f in declared_fields(node)}


def plain(doc: str) -> str:
    """A docstring on one line, reST roles and double backquotes made plain code spans."""
    text = " ".join(line.strip() for line in doc.strip().splitlines())
    return re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")


def first_sentence(doc: str) -> str:
    """The docstring's first sentence, without code marks (a flag's help): up to the first
    full stop that ends a sentence outside parentheses."""
    text, depth = plain(doc).replace("`", ""), 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "." and depth == 0 and (i + 1 == len(text) or text[i + 1] == " "):
            return text[: i + 1]
    return text
