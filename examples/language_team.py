"""The triage team of docs/guides/from-openai-agents.md, importable: the docs site draws
it with ``.. statemachine-agent:: examples.language_team:agent``
(``statemachine.docs.markdown``)."""

import statemachine as sm
from statemachine.steps import Handoffs
from statemachine.testing import FunctionModel


def triage_model(messages, tools):
    text = messages[-1].content[0].text
    language = "french" if "Bonjour" in text else "spanish" if "Hola" in text else "english"
    return sm.ToolCall("h1", f"transfer_to_{language}", {})


def speaker(greeting):
    return FunctionModel(lambda messages, tools: greeting)


french_model = speaker("Bonjour ! Comment puis-je vous aider ?")
team = Handoffs(
    {
        "triage": sm.Agent(
            FunctionModel(triage_model),
            instructions="Handoff to the appropriate agent based on the language of the request.",
        ),
        "french": sm.Agent(french_model, instructions="You only speak French"),
        "spanish": sm.Agent(
            speaker("¡Hola! ¿En qué puedo ayudarte?"), instructions="You only speak Spanish"
        ),
        "english": sm.Agent(
            speaker("Hello! How can I help?"), instructions="You only speak English"
        ),
    },
    routes={"triage": ["french", "spanish", "english"]},
    start="triage",
)

agent = team.agent
