"""A linear-chain CRF's tagging-scheme constraints (`jbert.model.crf`): which transitions a tag sequence may take,
and the schemes that decide them from label names.

IOB2: `I-X` only after `B-X` or `I-X`, never first. IOBES (BIOES; BILOU's L/U read as E/S): inside an entity only
`I-X` or `E-X` may come, outside only O, `B-Y` or `S-Y`, and a sequence ends outside one. IO (plain tags such as
PER, whose entities are runs of one type) forbids nothing. `scheme_of` recognises the scheme a label set is written
in; IOB1 (where `I-X` may begin an entity) and mixed label sets are none of them.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Constraints:
  """Which transitions a tag sequence may take: transitions [C][C] (previous, next), start [C], end [C].

  Held as tuples of bools so that a module holding them stays hashable; arrays of any shape-compatible kind are
  accepted and converted. `start`/`end` None allow every tag there.
  """
  transitions: Any
  start: Any = None
  end: Any = None

  def __post_init__(self):
    allowed = np.asarray(self.transitions, bool)
    c = allowed.shape[0] if allowed.ndim == 2 else 0
    if allowed.shape != (c, c) or c == 0:
      raise ValueError(f"CRF constraints: the allowed transitions must be a non-empty [C, C] matrix, got shape "
                       f"{allowed.shape}.")
    start = np.ones(c, bool) if self.start is None else np.asarray(self.start, bool)
    end = np.ones(c, bool) if self.end is None else np.asarray(self.end, bool)
    for name, v in (("start", start), ("end", end)):
      if v.shape != (c,):
        raise ValueError(f"CRF constraints: allowed {name} tags must have shape ({c},), got {v.shape}.")
      if not v.any():
        raise ValueError(f"CRF constraints allow no {name} tag, so no sequence is possible; allow at least one.")
    object.__setattr__(self, "transitions", tuple(map(tuple, allowed.tolist())))
    object.__setattr__(self, "start", tuple(start.tolist()))
    object.__setattr__(self, "end", tuple(end.tolist()))

  @property
  def num_tags(self) -> int:
    return len(self.start)

  def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(transitions [C, C], start [C], end [C]) as bool numpy arrays."""
    return np.array(self.transitions, bool), np.array(self.start, bool), np.array(self.end, bool)


SCHEMES = ("iob2", "iobes", "io")
# BILOU's last and unit prefixes are IOBES's E and S.
_PREFIXES = {"B": "B", "I": "I", "E": "E", "S": "S", "L": "E", "U": "S"}


def _split(label: str) -> tuple[str, str] | None:
  """("O", "") for O, (prefix, type) for PREFIX-TYPE, None for anything else."""
  if label == "O":
    return "O", ""
  prefix, sep, kind = label.partition("-")
  return (_PREFIXES[prefix], kind) if sep and kind and prefix in _PREFIXES else None


def scheme_of(label_names: Sequence[str]) -> str | None:
  """"iob2" or "iobes" when every label is O or PREFIX-TYPE of that scheme (BILOU counts as IOBES) and every tag
  can be reached under its constraints; "io" when every label but O is a plain type (PER, LOC); None otherwise
  (IOB1, where `I-X` may begin an entity, prefixed and plain labels mixed)."""
  parts = [_split(n) for n in label_names]
  if parts and all(p is None or p[0] == "O" for p in parts) and any(p is None for p in parts):
    return "io"
  if not parts or any(p is None for p in parts):
    return None
  by_type: dict[str, set[str]] = {}
  for prefix, kind in parts:
    if prefix != "O":
      by_type.setdefault(kind, set()).add(prefix)
  if not by_type:
    return None
  if all(prefixes <= {"B", "I"} for prefixes in by_type.values()):
    # An I-X without B-X could never be entered: the labels are IOB1's.
    return "iob2" if all("B" in prefixes for prefixes in by_type.values()) else None
  # IOBES: a multi-token entity needs both ends, and I-X lies between them.
  ok = all(("B" in p) == ("E" in p) and ("I" not in p or "B" in p) for p in by_type.values())
  return "iobes" if ok else None


def scheme_constraints(label_names: Sequence[str], scheme: str) -> Constraints:
  """The transitions `scheme` ("iob2" or "iobes") allows between `label_names`.

  IOB2: `I-X` follows only `B-X` or `I-X` and never starts a sequence. IOBES (BIOES; BILOU's L/U read as E/S): inside
  an entity (after `B-X`, `I-X`) only `I-X` or `E-X` may come; outside (at the start, after O, `E-X`, `S-X`) only
  O, `B-Y` or `S-Y`; a sequence ends outside an entity. IO (plain types and O): every sequence is a reading, so
  everything is allowed; the labels must all be plain.
  """
  if scheme not in SCHEMES:
    raise ValueError(f"Unknown tagging scheme {scheme!r}; use one of {', '.join(SCHEMES)}.")
  parts = [_split(n) for n in label_names]
  if scheme == "io":
    bad = [n for n, p in zip(label_names, parts) if p is not None and p[0] != "O"]
    if bad:
      raise ValueError(f"Label {bad[0]!r} is not an IO tag (O or a plain TYPE such as PER); name the labels in that "
                       "scheme or use the scheme their prefixes belong to.")
    return Constraints(np.ones((len(parts),) * 2, bool))
  allowed_prefixes = {"iob2": {"O", "B", "I"}, "iobes": {"O", "B", "I", "E", "S"}}[scheme]
  bad = [n for n, p in zip(label_names, parts) if p is None or p[0] not in allowed_prefixes]
  if bad:
    prefixes = "/".join(sorted(allowed_prefixes - {"O"}))
    raise ValueError(f"Label {bad[0]!r} is not an {scheme.upper()} tag (O or {prefixes}-TYPE); name the labels in "
                     "that scheme or turn the CRF's constraints off.")
  if scheme == "iob2":
    def ok(prev, nxt):
      return nxt[0] != "I" or (prev is not None and prev[0] in "BI" and prev[1] == nxt[1])
    ends = lambda tag: True
  else:
    def ok(prev, nxt):
      inside = prev is not None and prev[0] in "BI"
      return (nxt[0] in "IE" and prev[1] == nxt[1]) if inside else nxt[0] in "OBS"
    ends = lambda tag: tag[0] in "OES"
  return Constraints([[ok(p, n) for n in parts] for p in parts], [ok(None, n) for n in parts],
                     [ends(n) for n in parts])


def constraints_for(label_names: Sequence[str], scheme: str = "auto") -> Constraints | None:
  """The constraints of `scheme` ("iob2", "iobes", "io", "none", or "auto": the scheme the labels look like, none
  when they look like none of them); None where nothing is forbidden (none, and IO once its labels are checked)."""
  if scheme == "none":
    return None
  if scheme == "auto":
    scheme = scheme_of(label_names)
    if scheme is None:
      return None
  constraints = scheme_constraints(label_names, scheme)
  return None if scheme == "io" else constraints
