import pytest

from streamlearn.errors import ConfigError
from streamlearn.loadgen.profiles import ACCEPTED_FORMS, Constant, Ramp, Sine, Spike, Step, parse_profile


def test_constant_holds_its_rate():
    assert [Constant(2000).rate_at(t) for t in (0, 1.5, 1e6)] == [2000, 2000, 2000]


def test_ramp_is_linear_then_holds():
    ramp = Ramp(100, 5100, 50)
    assert ramp.rate_at(0) == 100
    assert ramp.rate_at(25) == pytest.approx(2600)
    assert ramp.rate_at(50) == 5100
    assert ramp.rate_at(500) == 5100


def test_ramp_down():
    assert Ramp(1000, 0, 10).rate_at(5) == pytest.approx(500)


def test_step_switches_at_its_time():
    step = Step(200, 4000, 30)
    assert (step.rate_at(29.99), step.rate_at(30), step.rate_at(90)) == (200, 4000, 4000)


def test_spike_only_inside_its_window():
    spike = Spike(500, 8000, 20, 5)
    assert [spike.rate_at(t) for t in (0, 19.9, 20, 24.9, 25, 60)] == [500, 500, 8000, 8000, 500, 500]


def test_sine_swings_around_its_mean():
    sine = Sine(2000, 1500, 60)
    assert sine.rate_at(0) == pytest.approx(2000)
    assert sine.rate_at(15) == pytest.approx(3500)
    assert sine.rate_at(45) == pytest.approx(500)
    assert min(sine.rate_at(t / 10) for t in range(1200)) >= 0


@pytest.mark.parametrize(("text", "expected"), [
    ("constant:2000", Constant(2000)),
    ("constant:0", Constant(0)),
    ("ramp:100:5000:60", Ramp(100, 5000, 60)),
    ("step:200:4000:30", Step(200, 4000, 30)),
    ("spike:500:8000:20:5", Spike(500, 8000, 20, 5)),
    ("sine:2000:1500:60", Sine(2000, 1500, 60)),
    (" Constant:2.5e3 ", Constant(2500)),
])
def test_parse_accepts_each_form(text, expected):
    assert parse_profile(text) == expected


@pytest.mark.parametrize("text", [
    "", "constant", "constant:", "constant:fast", "constant:-5", "constant:nan", "constant:1:2",
    "ramp:100:5000", "ramp:100:5000:0", "step:1:2:3:4", "spike:1:2:3", "sine:100:200:60",
    "sine:100:50:-1", "step:1:2:-3", "spike:1:2:3:0", "poisson:100", "2000",
])
def test_parse_rejects_bad_strings_and_shows_the_forms(text):
    with pytest.raises(ConfigError) as e:
        parse_profile(text)
    assert ACCEPTED_FORMS in str(e.value)


def test_unknown_profile_lists_every_accepted_form():
    with pytest.raises(ConfigError, match="constant:RATE.*ramp:.*step:.*spike:.*sine:"):
        parse_profile("poisson:100")


def test_profiles_are_frozen():
    with pytest.raises(AttributeError):
        Constant(1).rate = 2  # type: ignore[misc]
