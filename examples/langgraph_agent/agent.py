"""The arithmetic agent as a LangGraph graph (`pip install langgraph langchain-openai`): a model node
(LangChain's ChatOpenAI with the `python` tool bound) and LangGraph's ToolNode, looping until the model
answers without a tool call.

An agent-rl entrypoint (`type: agent`, examples/langgraph_agent/env.yaml): ChatOpenAI is pointed at the
episode's gateway session (`client.base_url`). Same tool and prompt as examples/arith_agent.
"""

from __future__ import annotations

from typing import Any

DESCRIPTION = "Run Python code in a sandbox and return what it prints."


def build_graph(llm: Any, sandbox: Any) -> Any:
    from langchain_core.tools import StructuredTool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    async def python(code: str) -> str:
        return await sandbox.run(code)

    tool = StructuredTool.from_function(coroutine=python, name="python", description=DESCRIPTION)
    model = llm.bind_tools([tool])

    async def call_model(state: MessagesState) -> dict:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode([tool]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile()


async def run(
    task: Any, client: Any, sandbox: Any, *, model: str = "policy", max_turns: int = 3
) -> str | None:
    """Answer `task.problem`; the last message's text, or None when the turns ran out."""
    from langchain_openai import ChatOpenAI
    from langgraph.errors import GraphRecursionError

    # the same session and key as `client` (the gateway refuses requests without the run's key)
    llm = ChatOpenAI(model=model, base_url=str(client.base_url), api_key=client.api_key, max_retries=0)
    graph = build_graph(llm, sandbox)
    try:  # each model call and each tool round is a graph step
        state = await graph.ainvoke(
            {"messages": [("user", task.problem)]}, {"recursion_limit": 2 * max_turns}
        )
    except GraphRecursionError:
        return None
    return state["messages"][-1].text
