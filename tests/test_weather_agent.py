"""The tool-using example's parts: its tool answers only for the task's city, in the unit named; its reward needs
the tool's number in the unit the question asked for."""

from __future__ import annotations

from examples import weather_agent as wa


def test_the_tool_answers_the_tasks_city_in_the_unit_named_and_says_what_is_wrong_otherwise() -> None:
    task = {"city": "Oslo", "unit": "fahrenheit", "temperature": -4}
    assert wa.run_tool(task, "get_temperature", '{"city": "oslo", "unit": "celsius"}') == "-4 C"
    assert wa.run_tool(task, "get_temperature", '{"city": "Oslo", "unit": "fahrenheit"}') == "25 F"
    assert wa.run_tool(task, "get_temperature", '{"city": "Lima", "unit": "celsius"}') == \
        "error: no weather station for 'Lima'"
    assert wa.run_tool(task, "get_temperature", '{"city": "Oslo", "unit": "kelvin"}').startswith("error: unit")
    assert wa.run_tool(task, "get_temperature", "{city: Oslo}").startswith("error: the arguments")
    assert wa.run_tool(task, "get_weather", '{"city": "Oslo"}').startswith("error: there is no tool")


def test_a_right_call_names_the_city_and_the_unit_asked_for() -> None:
    task = {"city": "Oslo", "unit": "fahrenheit", "temperature": -4}
    assert wa.called_right(task, '{"city": " OSLO", "unit": "fahrenheit"}')
    assert not wa.called_right(task, '{"city": "Oslo", "unit": "celsius"}')
    assert not wa.called_right(task, '{"city": "Lima", "unit": "fahrenheit"}')
    assert not wa.called_right(task, "not json")
    assert "Fahrenheit" in wa.question(task) and "Oslo" in wa.question(task)


def test_the_reward_needs_the_tools_number_in_the_unit_asked_for() -> None:
    task = {"city": "Oslo", "unit": "celsius", "temperature": -4}
    assert wa.reward(task, "It is -4 C in Oslo.") == 1.0
    assert wa.reward(task, "It is 4 C in Oslo.") == 0.0
    assert wa.reward(task, "It is -45 C.") == 0.0
    assert wa.reward({**task, "unit": "fahrenheit"}, "It is 25 F.") == 1.0
    assert wa.reward({**task, "unit": "fahrenheit"}, "It is -4 C.") == 0.0


def test_a_task_without_a_unit_is_in_celsius() -> None:
    assert wa.reward({"city": "Oslo", "temperature": 7}, "7") == 1.0
    assert "Celsius" in wa.question({"city": "Oslo", "temperature": 7})


def test_the_datasets_are_fixed_by_their_seeds_and_ask_for_both_units() -> None:
    assert wa.make_dataset(5, 0) == wa.make_dataset(5, 0) != wa.make_dataset(5, 1)
    tasks = wa.make_dataset(50, 0)
    assert all(t["city"] in wa.CITIES and t["unit"] in wa.UNITS and -9 <= t["temperature"] <= 39 for t in tasks)
    assert {t["unit"] for t in tasks} == set(wa.UNITS)
