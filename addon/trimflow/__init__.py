"""trimflow: keep LLM agent requests under provider image and size limits, at the wire.

The engine is pure Python with no mitmproxy import: `prune_request` (or `prune` for a resolved
`Target`) applies `Rules` to one request body. The parts around it:
- `trimflow.formats`: one module per wire format behind one interface;
- `trimflow.proxy`: the mitmproxy addons (`mitmdump -s addon/mitm.py`, `python -m trimflow run`);
- `trimflow.audit`: audit recorded traffic, with a CI gate;
- `trimflow.repair`: apply the rules to an agent's saved session, so that resuming it works;
- `trimflow.testing`: the fake provider, replay and synthetic sessions, to reproduce failures offline;
- `trimflow.cli`: the command-line tools behind `python -m trimflow COMMAND` (run and its launcher, prune, learned).
docs/development.md maps every module.
"""

from ._engine import NeedsWorker, Outcome, prune, prune_request
from ._limits import Limits
from ._placeholder import DEFAULT_PLACEHOLDER
from ._record import ENFORCE, MODES, OBSERVE, Record
from ._rules import Rules, Target, builtin_rules
from ._rules_file import DEFAULT_RULES_PATH, RulesFile, load_rules, parse_rules
from .errors import BodyError, DecodeError, ExpressionError, InputError, ProfilesError, RulesError, SessionError, TrimflowError, UnknownProfile
from .formats import FORMATS, Media, detect_shape

__all__ = [
    "DEFAULT_PLACEHOLDER",
    "DEFAULT_RULES_PATH",
    "ENFORCE",
    "FORMATS",
    "MODES",
    "OBSERVE",
    "BodyError",
    "DecodeError",
    "ExpressionError",
    "InputError",
    "Limits",
    "Media",
    "NeedsWorker",
    "Outcome",
    "ProfilesError",
    "Record",
    "Rules",
    "RulesError",
    "RulesFile",
    "SessionError",
    "Target",
    "TrimflowError",
    "UnknownProfile",
    "builtin_rules",
    "detect_shape",
    "load_rules",
    "parse_rules",
    "prune",
    "prune_request",
]
