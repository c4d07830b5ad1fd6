"""MkDocs hook: the OpenAPI reference page, made from this checkout's schema at build time.

`manage.py spectacular` writes the schema (no network, no database: drf-spectacular reads the
URL map and the serializers); the page `api-schema.md` gets one section per operation and per
component in place of its `<!-- openapi -->` marker, and the raw schema is published beside it
as `openapi.json`. A subprocess, so the docs build never sets up Django in its own process.
"""

import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from mkdocs.structure.files import File

MARKER = "<!-- openapi -->"
PAGE = "api-schema.md"
METHODS = ("get", "post", "put", "patch", "delete")
READ_ONLY = " (read-only)"

_schema: dict = {}


def on_config(config):
    root = Path(config.config_file_path).resolve().parent
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "openapi.json"
        result = subprocess.run(
            [sys.executable, "manage.py", "spectacular", "--format", "openapi-json"]
            + ["--file", str(target)],
            cwd=root,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise SystemExit(f"manage.py spectacular failed:\n{result.stderr}")
        _schema.clear()
        _schema.update(json.loads(target.read_text()))
    return config


def on_files(files, config):
    files.append(File.generated(config, "openapi.json", content=json.dumps(_schema, indent=1)))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri != PAGE:
        return markdown
    return markdown.replace(MARKER, render(_schema))


def _cell(text: object) -> str:
    return " ".join(str(text or "").split()).replace("|", "\\|")


def _type(schema: dict) -> str:
    """A short type: `string`, `integer`, `array of Volume`, a link to a component."""
    if ref := schema.get("$ref"):
        name = ref.rsplit("/", 1)[-1]
        return f"[{name}](#schema-{name.lower()})"
    for combined in ("allOf", "oneOf", "anyOf"):
        if parts := schema.get(combined):
            return " or ".join(_type(part) for part in parts)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = " or ".join(kind)
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if schema.get("enum"):
        return " \\| ".join(f"`{value}`" for value in schema["enum"] if value is not None)
    if fmt := schema.get("format"):
        return f"{kind} ({fmt})"
    return kind


def _body(content: dict) -> str:
    return ", ".join(f"{_type(v.get('schema', {}))} as `{media}`" for media, v in content.items())


def render(schema: dict) -> str:
    operations = [
        (path, method, item[method])
        for path, item in schema.get("paths", {}).items()
        for method in METHODS
        if method in item
    ]
    # A description shared by many operations is a base view's docstring, not theirs.
    texts = Counter(op.get("description", "") for _, _, op in operations)
    out = [f"Generated from this build's schema (OpenAPI {schema.get('openapi', '3')}).", ""]
    for path, method, operation in operations:
        out += [f"### `{method.upper()} {path}`", ""]
        text = operation.get("summary") or operation.get("description") or ""
        if text and texts[text] < 3:
            out += [" ".join(text.split()), ""]
        if params := operation.get("parameters", []):
            out += ["| parameter | in | type | required | |", "|---|---|---|---|---|"]
            out += [
                f"| `{p['name']}` | {p.get('in', '')} | {_type(p.get('schema', {}))} | "
                f"{'yes' if p.get('required') else ''} | {_cell(p.get('description'))} |"
                for p in params
            ]
            out.append("")
        if body := operation.get("requestBody"):
            out += [f"**Body**: {_body(body.get('content', {}))}", ""]
        responses = operation.get("responses", {})
        ok = {s: r for s, r in responses.items() if not s.startswith(("4", "5"))}
        out += ["| status | body | |", "|---|---|---|"]
        out += [
            f"| {status} | {_body(r.get('content', {}))} | {_cell(r.get('description'))} |"
            for status, r in ok.items()
        ]
        if failed := [s for s in responses if s not in ok]:
            out += ["", f"Errors ([Error](#schema-error)): {', '.join(failed)}."]
        out.append("")
    out += ["## Components", ""]
    for name, component in schema.get("components", {}).get("schemas", {}).items():
        out += [f"### {name} {{#schema-{name.lower()}}}", ""]
        if text := component.get("description"):
            out += [" ".join(text.split()), ""]
        properties = component.get("properties", {})
        required = set(component.get("required", []))
        if properties:
            out += ["| field | type | required | |", "|---|---|---|---|"]
            out += [
                f"| `{field}` | {_type(spec)} | {'yes' if field in required else ''} | "
                f"{_cell(spec.get('description'))}{READ_ONLY if spec.get('readOnly') else ''} |"
                for field, spec in properties.items()
            ]
        else:
            out.append(f"Type: {_type(component)}")
        out.append("")
    return "\n".join(out)
