"""Audit recorded LLM traffic: growth per turn, the turn that crosses each limit, what a rules file would
change, the provider's cache usage and its cost, and a CI gate over all of it.

Inputs are mitmproxy dumps (`mitmdump -w`), HAR files and trimflow's metrics JSONL.
`python -m trimflow audit` (and `scripts/audit`) is the command line; from Python:

    reader = Reader(rules, limits, what_if=False)
    summary = summarize(reader.rows(reader.check(paths)), reader.tallies, None, "rules/default.yaml", [])
    expressions = [parse_expression("images>8")]
    gate = Gate(expressions, evaluate(expressions, summary))
"""

from ._cli import main
from ._gate import Breach, Expression, ExpressionError, Gate, evaluate
from ._gate import parse as parse_expression
from ._read import InputError, InputTally, Reader, Row
from ._report import recalls_text, usage_text
from ._summary import UNKNOWN_CONVERSATION, Conversation, Crossing, ProfileLimits, Summary, Totals, summarize

__all__ = [
    "UNKNOWN_CONVERSATION",
    "Breach",
    "Conversation",
    "Crossing",
    "Expression",
    "ExpressionError",
    "Gate",
    "InputError",
    "InputTally",
    "ProfileLimits",
    "Reader",
    "Row",
    "Summary",
    "Totals",
    "evaluate",
    "main",
    "parse_expression",
    "recalls_text",
    "summarize",
    "usage_text",
]
