"""The refund agent of the steps guide (docs/guides/steps.md), importable: the docs
site draws it with ``.. statemachine-agent:: examples.refund_agent:agent``
(``statemachine.docs.markdown``)."""

from statemachine import Agent, tool
from statemachine.steps import output_guardrail
from statemachine.testing import ScriptedModel


@tool
def lookup_order(order: str) -> str:
    """The order's amount and status."""
    return f"order {order}: 240 EUR, delivered damaged"


def refund_limit(answer: str) -> str | None:
    """None lets the answer through; a string is why it may not go out."""
    if "240 EUR" in answer:
        return "Refunds above 100 EUR need a person: offer 100 EUR and say a person will call."
    return None


guard = output_guardrail(
    "refund_limit",
    refund_limit,
    state="NeedsHumanReview",
    explanation="the answer promised a refund above 100 EUR",
)


def refund_agent(*answers: object) -> Agent:
    return Agent(ScriptedModel(*answers), name="Refund desk", tools=[lookup_order], steps=[guard])


agent = refund_agent()
