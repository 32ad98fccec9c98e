"""Config validation outside Snakemake and semantic checks the JSON schema cannot express."""

from __future__ import annotations

import contextlib
import copy
import difflib
import functools
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from repdiag.core.checks import semantic_checks
from repdiag.core.errors import ConfigError
from repdiag.core.validation import SCHEMA, schema_file, validate_config

# libyaml's parser where PyYAML was built with it: a config/config.yaml parses 6x faster (0.05 s), and
# every Snakemake call of the workflow parses its config files twice.
_SAFE_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class UniqueKeyLoader(_SAFE_LOADER):
    """A safe YAML loader (libyaml's where available) that refuses a mapping key given twice.

    PyYAML (and so Snakemake's ``--configfile``) silently keeps the last of two equal keys, so a
    model pasted twice under ``models`` would quietly drop the first entry. This loader raises a
    :class:`ConfigError` naming the file, the line, the key and the mapping that holds it.
    Merge keys (``<<: *anchor``) may still be overridden, as YAML intends.
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.name = getattr(stream, "name", "<string>")  # libyaml's parser keeps no name

    def construct_document(self, node: yaml.Node) -> Any:
        _check_aliases(self, node)
        _reject_duplicate_keys(self, node, "", set())
        return super().construct_document(node)


def _check_tag(loader: yaml.SafeLoader, node: yaml.Node, where: str) -> None:
    """Refuse a node whose tag the safe loader cannot build (``!!python/object/apply:...``, a
    custom ``!tag``), naming the file, line and key: PyYAML would raise a multi-line
    ConstructorError naming neither the key nor what to do."""
    if node.tag in loader.yaml_constructors or node.tag.startswith("tag:yaml.org,2002:merge"):
        return
    line = node.start_mark.line + 1
    raise ConfigError(
        f"config file {loader.name} line {line}: key {where or '(top level)'} has the YAML tag "
        f"{node.tag!r}, which a config may not use (a python/ tag would run code); write the "
        "plain value instead"
    )


# Anchors and aliases are fine in a config, but an alias bomb (a few KB that expand to millions of
# nodes) would make every later walk of the config (validation, params, error messages) hang.
MAX_YAML_ALIASES = 1000
MAX_YAML_NODES = 200_000


def _check_aliases(loader: yaml.SafeLoader, root: yaml.Node) -> None:
    """Refuse a document with too many aliases or too large once aliases are expanded.

    Counted on the composed node graph (each distinct node once, memoised), so the check itself
    is linear in the size of the file.
    """
    sizes: dict[int, int] = {}
    aliases = 0
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            children = _children(node)
            sizes[id(node)] = 1 + sum(sizes.get(id(child), 1) for child in children)
            continue
        if id(node) in sizes:
            aliases += 1
            continue
        sizes[id(node)] = 1  # a recursive alias counts once while its size is being summed
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node))
    total = sizes[id(root)]
    if aliases > MAX_YAML_ALIASES or total > MAX_YAML_NODES:
        raise ConfigError(
            f"config file {loader.name}: {aliases} aliases expanding to {total} YAML nodes, over "
            f"the limits ({MAX_YAML_ALIASES} aliases, {MAX_YAML_NODES} nodes); write the values "
            "out instead of nesting aliases (an alias bomb would make validation hang)"
        )


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _reject_duplicate_keys(
    loader: yaml.SafeLoader, node: yaml.Node, where: str, walked: set[int]
) -> None:
    """Walk the composed ``node`` tree; raise at the second occurrence of a key in a mapping."""
    if id(node) in walked:  # an alias of a node already walked (or a recursive structure)
        return
    walked.add(id(node))
    _check_tag(loader, node, where)
    if isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _reject_duplicate_keys(loader, item, f"{where}[{index}]", walked)
    elif isinstance(node, yaml.MappingNode):
        first_line: dict[Any, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                _reject_duplicate_keys(loader, value_node, where, walked)
                continue
            _check_tag(loader, key_node, where)
            key = loader.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                duplicate = key in first_line
            except TypeError:  # an unhashable key: SafeLoader reports it itself
                continue
            if duplicate:
                inside = f"in {where}" if where else "at the top level"
                raise ConfigError(
                    f"config file {loader.name} line {line}: duplicate key {key!r} {inside} "
                    f"(first on line {first_line[key]}); YAML would silently keep only the last "
                    "one: remove or rename one of them"
                )
            first_line[key] = line
            _reject_duplicate_keys(
                loader, value_node, f"{where}.{key}" if where else str(key), walked
            )


def schema_error(err: BaseException) -> ConfigError:
    """A short :class:`ConfigError` for a failed schema validation: the key path, the rule broken
    and (cut to 300 characters) jsonschema's message, never the whole instance, which for a big
    or alias-expanded value would take minutes to print."""
    inner = next(
        (
            e
            for e in (err, err.__context__, err.__cause__, *getattr(err, "args", ()))
            if hasattr(e, "absolute_path")
        ),
        None,
    )
    if inner is None:
        text = str(err)
        return ConfigError(text if len(text) <= 2000 else text[:2000] + " ...")
    path = list(inner.absolute_path)
    dotted = ".".join(str(p) for p in path) or "(top level)"
    where = "instance" + "".join(f"[{p!r}]" for p in path)
    message = inner.message if len(inner.message) <= 300 else inner.message[:300] + " ..."
    return ConfigError(
        f"config key {dotted} ({where}) breaks the schema rule {inner.validator!r}: {message}"
        + did_you_mean(inner)
    )


def did_you_mean(error: Any) -> str:
    """For an unknown key (``additionalProperties``), the allowed keys closest to it (difflib)."""
    if getattr(error, "validator", None) != "additionalProperties":
        return ""
    schema = getattr(error, "schema", None) or {}
    allowed = sorted((schema.get("properties") or {}).keys())
    instance = error.instance if isinstance(error.instance, dict) else {}
    unknown = [key for key in instance if key not in allowed and isinstance(key, str)]
    hints = []
    for key in unknown[:5]:
        close = difflib.get_close_matches(key, allowed, n=3, cutoff=0.6)
        hints.append(f"{key!r}: did you mean {' or '.join(map(repr, close))}?" if close else "")
    hints = [hint for hint in hints if hint]
    listed = ", ".join(allowed) if len(allowed) <= 30 else ", ".join(allowed[:30]) + ", ..."
    return (" " + " ".join(hints) if hints else "") + (f" (allowed: {listed})" if allowed else "")


def _short_schema_str(error: Any) -> str:
    path = "".join(f"[{p!r}]" for p in error.absolute_path)
    message = error.message if len(error.message) <= 300 else error.message[:300] + " ..."
    return f"{message} (rule {error.validator!r} on instance{path})"


@contextlib.contextmanager
def short_schema_errors(files: Iterable[str | Path] = ()) -> Iterator[None]:
    """Around a schema validation: a schema error becomes a :func:`schema_error`.

    Snakemake formats the jsonschema error eagerly, and its ``str`` pretty-prints the whole
    instance and schema (minutes for a big value); inside this block it is one short line.
    ``files`` (Snakemake's ``workflow.configfiles``) are named in the message.
    """
    from jsonschema.exceptions import _Error

    original = _Error.__str__
    _Error.__str__ = _short_schema_str
    try:
        yield
    except Exception as err:
        if any(hasattr(e, "absolute_path") for e in (err, err.__context__)):
            named = ", ".join(str(f) for f in files)
            error = schema_error(err)
            raise (ConfigError(f"config file {named}: {error}") if named else error) from None
        raise
    finally:
        _Error.__str__ = original


YTE_MARKER = "__use_yte__"
"""The key that makes Snakemake read a config file through its YAML template engine (YTE), whose
``?expression`` values are Python evaluated while the file is read."""


def _unique_json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ConfigError(f"key {key!r} is given twice in one JSON object; keep one of them")
        seen[key] = value
    return seen


def one_line(err: BaseException | str) -> str:
    """An error's text on one line (PyYAML's messages span several, with the file and mark)."""
    return " ".join(str(err).split())


def load_yaml(path: str | Path) -> Any:
    """Parse a YAML (or JSON) file like ``yaml.safe_load``, refusing duplicate mapping keys.

    A file PyYAML cannot parse (JSON with tabs, say) is parsed as JSON, duplicate keys refused
    there too; a file neither can parse is a :class:`ConfigError` naming it. A config that asks
    for Snakemake's template engine (``__use_yte__``) is refused: its templates are code.
    """
    try:
        with open(path, encoding="utf-8") as handle:  # the handle names the file in errors
            data = yaml.load(handle, Loader=UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except (yaml.scanner.ScannerError, yaml.parser.ParserError) as yaml_error:
        try:
            text = Path(path).read_text(encoding="utf-8")
            data = json.loads(text, object_pairs_hook=_unique_json_object)
        except ConfigError as err:
            raise ConfigError(f"config file {path}: {err}") from None
        except ValueError as json_error:
            raise ConfigError(
                f"config file {path} is neither YAML ({one_line(yaml_error)}) nor JSON "
                f"({json_error})"
            ) from None
    except (yaml.YAMLError, OSError, UnicodeDecodeError) as err:  # unreadable, not UTF-8, ...
        raise ConfigError(f"config file {path}: {one_line(err)}") from None
    if isinstance(data, dict) and YTE_MARKER in data:
        raise ConfigError(
            f"config file {path} sets {YTE_MARKER}: Snakemake would evaluate its ?-expressions "
            "as Python while reading it. repdiag refuses template configs; write the values out "
            "(and check a config from elsewhere with `repdiag validate` before running it)"
        )
    return data


def check_config_files(paths: Iterable[str | Path]) -> None:
    """Re-read the config files Snakemake loaded (``workflow.configfiles``) with :func:`load_yaml`.

    Snakemake parses them with a loader that keeps the last of two equal keys; this turns such a
    silent loss into an error before validation, in YAML and in JSON files alike, and refuses a
    template config (``__use_yte__``), exactly as ``repdiag validate`` does.
    """
    for path in paths:
        if Path(path).is_file():
            load_yaml(path)


def _resolve(schema: Mapping[str, Any], base: Path) -> tuple[Mapping[str, Any], Path]:
    """Follow a relative-file ``$ref`` (the only kind our schemas use)."""
    while "$ref" in schema:
        target = (base / schema["$ref"]).resolve()
        schema, base = schema_file(target), target.parent
    return schema, base


def schema_defaults(section: str) -> dict[str, Any]:
    """Config section ``section`` with nothing set: every default its schema gives, and only those
    (the one place defaults are written is the schema)."""
    config: dict[str, Any] = {section: {}}
    fill_defaults(config)
    return config[section]


def fill_defaults(
    config: Any, schema: Mapping[str, Any] | None = None, base: Path | None = None
) -> Any:
    """Set every schema ``default`` missing from ``config``, following ``$ref`` into section files.

    Schema validation (:func:`repdiag.core.validation.validate_config`) fills defaults only inside
    sections present; this completes the job so that stages can rely on every key being present.
    On the whole config it also declares the runs of every ``series`` grid
    (:func:`repdiag.core.series.expand_series`) and of every run's ``save_at``
    (:func:`repdiag.core.series.expand_saved`), so every reader sees them.
    """
    if schema is None:  # the whole config: then the runs its series and save_at declare
        root = schema_file(SCHEMA.resolve())
        fill_defaults(config, root, SCHEMA.parent)
        if isinstance(config, dict):
            from repdiag.core.series import expand_saved, expand_series

            if config.get("series"):
                expand_series(config)
                fill_defaults(config, root, SCHEMA.parent)
            if expand_saved(config):  # it declared models (a series run's saved steps)
                fill_defaults(config, root, SCHEMA.parent)
        return config
    schema, base = _resolve(schema, base)
    if isinstance(config, dict):
        for key, sub in schema.get("properties", {}).items():
            sub, sub_base = _resolve(sub, base)
            if key not in config and "default" in sub:
                config[key] = copy.deepcopy(sub["default"])
            if key in config:
                fill_defaults(config[key], sub, sub_base)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, value in config.items():
                if key not in schema.get("properties", {}):
                    fill_defaults(value, extra, base)
    elif isinstance(config, list) and isinstance(schema.get("items"), dict):
        for item in config:
            fill_defaults(item, schema["items"], base)
    return config


SEED_LIMIT = 2**63  # numpy and torch seeds are int64 (torch.manual_seed overflows above)


def _key_paths(value: Any, path: str = "") -> Iterator[tuple[str, str, Any]]:
    """(dotted path, the key the value sits under, value) for every leaf of a config."""
    if isinstance(value, Mapping):
        for key, child in value.items():
            yield from _key_paths(child, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _key_paths(child, f"{path}[{index}]")
    else:
        yield path, path.rsplit(".", 1)[-1].split("[", 1)[0], value


# Stated caps on sizes, by the key a number sits under (anywhere, kwargs included): far above any
# setting this workflow runs (config/paper.yaml included), far below what would allocate past a
# machine's memory (a job asked for n_queries 1e12 or img_size 1e6 died allocating 3.6 TiB).
SIZE_CAPS: tuple[tuple[re.Pattern[str], int, str], ...] = (
    (re.compile(r"^(image_size|img_size|input_size|force_image_size)$"), 4096, "an image side"),
    (re.compile(r"batch_size$"), 1 << 20, "a batch size"),
    (
        re.compile(r"^(steps|stop_at|epochs|max_steps|max_iter|warmup_epochs)$"),
        10**8,
        "a step count",
    ),
    (
        re.compile(
            r"^(\w+_dim|\w+_dims|dims|hidden|width|text_width|n_latents|latent_dim|depth|"
            r"\w+_depth|num_heads|\w+_heads|patch_size|mask_patch)$"
        ),
        1 << 16,
        "a width or depth",
    ),
    (re.compile(r"^(n|n_\w+|max_images|max_size|max_per_\w+|k|aux_k)$"), 10**7, "a count"),
)


def _size_cap(key: str) -> tuple[int, str] | None:
    for pattern, cap, kind in SIZE_CAPS:
        if pattern.search(key):
            return cap, kind
    return None


def check_numbers(config: Mapping[str, Any]) -> None:
    """Every number finite (NaN and inf pass every range check of a schema, then fail deep in a
    job), every seed (a key ``seed``, or an item of a list ``seeds``) in [0, 2^63), and every
    size under its stated cap (:data:`SIZE_CAPS`, by key name, kwargs included)."""
    for path, key, value in _key_paths(config):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{path}: {value} is not a finite number; give a finite value")
        number = isinstance(value, int | float) and not isinstance(value, bool)
        cap = _size_cap(key) if number and key not in ("seed", "seeds") else None
        if cap is not None and value > cap[0]:
            raise ConfigError(
                f"{path}: {value} is above the cap for {cap[1]} ({cap[0]}); the jobs would "
                "allocate past any machine's memory. Give a smaller value (repdiag.core.config."
                "SIZE_CAPS states the caps)"
            )
        is_seed = key == "seed" or (key == "seeds" and path.endswith("]"))
        if is_seed and isinstance(value, int) and not isinstance(value, bool):
            if not 0 <= value < SEED_LIMIT:
                raise ConfigError(
                    f"{path}: seed {value} is outside [0, 2^63); torch and numpy take 64-bit "
                    "seeds, so give a smaller one"
                )


def check_config(config: Mapping[str, Any]) -> None:
    """Run the semantic checks: the numbers (:func:`check_numbers`), then every registered
    package's cross-key checks (:func:`repdiag.core.checks.semantic_checks`). Call after
    JSON-schema validation (the Snakefile does both)."""
    check_numbers(config)
    for check in semantic_checks():
        check(config)


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a YAML config and validate it with the workflow's own schema and checks."""
    path = Path(path)
    if not path.is_file():
        what = "is not a regular file (a folder, FIFO or device)" if path.exists() else ""
        raise ConfigError(f"config file {path} {what or 'does not exist'}; give a YAML file")
    config = load_yaml(path) or {}
    try:
        with short_schema_errors():
            validate_config(config)
    except Exception as err:  # a ConfigError's own cause is noise here
        raise ConfigError(f"{path}: {err}") from (None if isinstance(err, ConfigError) else err)
    fill_defaults(config)
    check_config(config)
    return config


class SortedReprDict(dict):
    """A dict whose ``repr`` lists its keys sorted; iteration keeps the config's order (Snakemake
    compares params by ``repr``: a config mapping's key order would otherwise rerun its jobs)."""

    def __repr__(self) -> str:
        items = sorted(self.items(), key=lambda item: repr(item[0]))
        return "{" + ", ".join(f"{key!r}: {value!r}" for key, value in items) + "}"

    def __reduce__(self):  # pickled into job scripts as a plain subclass of dict
        return SortedReprDict, (list(self.items()),)


def canonical(value: Any) -> Any:
    """``value`` with every plain dict (at any depth) a :class:`SortedReprDict`."""
    if type(value) in (dict, SortedReprDict):
        return SortedReprDict((key, canonical(item)) for key, item in value.items())
    if type(value) is list:
        return [canonical(item) for item in value]
    if type(value) is tuple:
        return tuple(canonical(item) for item in value)
    return value


def canonical_params(rules: Iterable[Any]) -> None:
    """Make every param of every rule compare by value, not by key order (see SortedReprDict).

    Why it must be done this way: Snakemake reruns a job when the ``repr`` of its params differs
    from the recorded one, and a mapping's ``repr`` follows its keys' order, so a config with its
    keys reordered would rerun every job that reads it. Snakemake has no hook to normalise
    params, so the Snakefile calls this once after the last rule is defined. Param functions are
    wrapped (their signature kept, which Snakemake reads); plain values are converted once. A
    named param is both an item of Snakemake's ``Namedlist`` and an attribute, indexed by its
    private ``_names``; both must be replaced. ``tests/reliability/test_hostile_configs.py`` (a
    config with every mapping reordered reruns nothing) fails if a Snakemake release changes
    this.
    """

    def wrap(value: Any) -> Any:
        if not callable(value):
            return canonical(value)

        @functools.wraps(value)
        def canonical_param(*args: Any, **kwargs: Any) -> Any:
            return canonical(value(*args, **kwargs))

        return canonical_param

    for rule in rules:
        params = rule.params
        for index, value in enumerate(params):
            params[index] = wrap(value)
        # a named param is also an attribute of the list, and Snakemake reads that one
        for name, (start, end) in getattr(params, "_names", {}).items():
            if end is None:
                setattr(params, name, params[start])


def seeded(part: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of config section ``part`` whose ``seed: null`` is replaced by the global ``seed``."""
    seed = part.get("seed")
    return {**part, "seed": int(config.get("seed", 0)) if seed is None else seed}


def section(config: Mapping[str, Any], *keys: str) -> Any:
    """``config[k1][k2]...`` with an error naming the dotted key when one is missing."""
    node: Any = config
    for depth, key in enumerate(keys):
        if not isinstance(node, Mapping) or key not in node:
            raise ConfigError(f"config key {'.'.join(keys[: depth + 1])!r} is missing")
        node = node[key]
    return node
