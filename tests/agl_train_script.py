"""An agent as an Agent Lightning 0.3 user writes it, run by Agent Lightning's own trainer as a runner only.

Run by tests/test_fit_agl.py with the Agent Lightning virtualenv's python: ``python agl_train_script.py URL``.
Nothing here knows litstream: the URL (the gateway that ``Trainer(gateway=True)`` prints) becomes Agent
Lightning's own client-server settings (``AGL_CURRENT_ROLE=runner``, ``AGL_SERVER_HOST``, ``AGL_SERVER_PORT``),
exactly what a user sets to point an existing script at a remote store. The runner claims rollouts until it is
stopped.
"""

import os
import sys
from urllib.parse import urlsplit

import agentlightning as agl
import openai

LETTERS = "abcd"  # the toy copy task, as litstream/trainer/toy_task.py (this virtualenv cannot import it)
MAX_NEW_TOKENS = 3


def render_prompt(task: dict) -> str:
    return f"{task['letter']}x{task['count']}="


def reward(task: dict, response_text: str, class_credit: float = 0.25) -> float:
    want, got = str(task["letter"]) * int(task["count"]), response_text
    credit = sum(1.0 if g == w else class_credit if g in LETTERS else 0.0 for w, g in zip(want, got))
    return credit / max(len(want), len(got), 1)


@agl.rollout
def copy_agent(task: dict, llm: agl.LLM) -> float:
    """One chat call to the policy (``llm`` is the per-attempt URL Agent Lightning resolves from the ProxyLLM)."""
    client = openai.OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "unused", max_retries=2)
    answer = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": render_prompt(task)}],
        max_tokens=MAX_NEW_TOKENS, temperature=1.0)
    return reward(task, answer.choices[0].message.content or "")


if __name__ == "__main__":
    url = urlsplit(sys.argv[1])
    os.environ.update({"AGL_CURRENT_ROLE": "runner", "AGL_SERVER_HOST": url.hostname or "127.0.0.1",
                       "AGL_SERVER_PORT": str(url.port or 80)})
    agl.Trainer(n_runners=1).fit(copy_agent)
