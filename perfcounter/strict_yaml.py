"""YAML as perfcounter reads its files (device specs, mappings): strict and bounded.

`load_yaml(text)` is yaml.safe_load with three changes:
- a key given twice in one mapping raises `DuplicateKey` naming the key's path and both
  lines (plain PyYAML keeps the last one silently); a merge key (`<<: *base`) may be
  overridden, as YAML means it;
- 1e12 is read as the float it means (YAML 1.2), not as a string;
- a document whose aliases expand to more than `MAX_VALUES` values ("billion laughs":
  a few hundred bytes that name each other's anchors nine levels deep) raises
  `YamlTooLarge` before anything walks or prints it. Anchors and aliases themselves
  stay legal: the registry's files share figures through them.
A leaf: it imports PyYAML only.
"""
from __future__ import annotations

import re

import yaml

MAX_VALUES = 100_000  # values of a document with its aliases expanded; ours hold < 5,000


class DuplicateKey(yaml.YAMLError):
    """A mapping gives `path[-1]` twice; `lines` are both places (1-based); `upmem` (set by
    the loader, which sees the whole document) whether it has no top-level `devices:`."""

    def __init__(self, path: tuple, lines: tuple[int, int]):
        super().__init__(path, lines)
        self.path, self.lines, self.upmem = path, lines, False


class YamlTooLarge(yaml.YAMLError):
    """A document whose aliases expand past MAX_VALUES values."""


class StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses duplicate keys and unbounded alias expansion and reads
    1e12 as a float."""

    def construct_document(self, node):
        if _expanded_size(node, MAX_VALUES) > MAX_VALUES:
            raise YamlTooLarge(f"its aliases expand to more than {MAX_VALUES:,} values; "
                               "refusing to read it (nested aliases?)")
        try:
            self._check_keys(node, (), set())
        except DuplicateKey as dup:
            dup.upmem = not (isinstance(node, yaml.MappingNode)
                             and any(k.value == "devices" for k, _ in node.value))
            raise
        return super().construct_document(node)

    def _check_keys(self, node, path: tuple, done: set) -> None:
        if id(node) in done:  # an alias met again
            return
        done.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            for i, child in enumerate(node.value):
                self._check_keys(child, (*path, i), done)
        elif isinstance(node, yaml.MappingNode):
            first = {}
            for key_node, child in node.value:
                key = key_node.value
                if key_node.tag != "tag:yaml.org,2002:merge":  # `<<: *base` may be overridden
                    key = self.construct_object(key_node, deep=True)
                    try:
                        earlier = first.setdefault(key, key_node)
                    except TypeError:  # an unhashable key: SafeLoader refuses it later
                        earlier = key_node
                    if earlier is not key_node:
                        raise DuplicateKey((*path, key), (earlier.start_mark.line + 1,
                                                          key_node.start_mark.line + 1))
                self._check_keys(child, (*path, key), done)


StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def _expanded_size(root, budget: int) -> int:
    """Values under `root` with every alias expanded, counted up to just past `budget`
    (so a document of a billion values costs budget steps, not a billion); each node's
    size is computed once, so sharing is cheap to measure. A node that contains itself
    expands without end: past the budget."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack = [root]
    while stack:
        node = stack[-1]
        if id(node) in sizes:
            stack.pop()
            continue
        children = ([c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode)
                    else node.value if isinstance(node, yaml.SequenceNode) else [])
        if any(id(c) in open_nodes for c in children):
            return budget + 1  # recursive
        todo = [c for c in children if id(c) not in sizes]
        if todo and id(node) not in open_nodes:
            open_nodes.add(id(node))
            stack.extend(todo)
            continue
        open_nodes.discard(id(node))
        sizes[id(node)] = min(1 + sum(sizes[id(c)] for c in children), budget + 1)
        stack.pop()
    return sizes[id(root)]


def load_yaml(text: str):
    """The document in `text`, read strictly (see the module doc)."""
    return yaml.load(text, Loader=StrictLoader)


def one_line(exc: Exception) -> str:
    """A YAML (or JSON) error as one line: PyYAML's problem and where, not its three-line
    excerpt of the text."""
    problem, mark = getattr(exc, "problem", None), getattr(exc, "problem_mark", None)
    if problem and mark is not None:
        context = getattr(exc, "context", None)
        return (f"{f'{context}: ' if context else ''}{problem} (line {mark.line + 1}, "
                f"column {mark.column + 1})")
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
