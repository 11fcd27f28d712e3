"""What `agent-rl serve` and the recording gateway share of OpenAI's API: request bodies (protocol.py),
chat rendering and response pieces (chat.py), tool-call parsers (tool_parsers.py), chat templates
(templates.py) and error replies in OpenAI's body (errors.py)."""
