"""The tool-using example's parts: its tool answers only for the task's city, its reward needs the tool's number."""

from __future__ import annotations

from examples import weather_agent as wa


def test_the_tool_answers_the_tasks_city_and_says_what_is_wrong_otherwise() -> None:
    task = {"city": "Oslo", "temperature": -4}
    assert wa.run_tool(task, "get_temperature", '{"city": "oslo"}') == "-4 C"
    assert wa.run_tool(task, "get_temperature", '{"city": "Lima"}') == "error: no weather station for 'Lima'"
    assert wa.run_tool(task, "get_temperature", "{city: Oslo}").startswith("error: the arguments")
    assert wa.run_tool(task, "get_weather", '{"city": "Oslo"}').startswith("error: there is no tool")


def test_the_reward_needs_the_tools_number_as_a_whole_number() -> None:
    task = {"city": "Oslo", "temperature": -4}
    assert wa.reward(task, "It is -4 C in Oslo.") == 1.0
    assert wa.reward(task, "It is 4 C in Oslo.") == 0.0
    assert wa.reward(task, "It is -45 C.") == 0.0


def test_the_datasets_are_fixed_by_their_seeds() -> None:
    assert wa.make_dataset(5, 0) == wa.make_dataset(5, 0) != wa.make_dataset(5, 1)
    assert all(t["city"] in wa.CITIES and -9 <= t["temperature"] <= 39 for t in wa.make_dataset(50, 0))

