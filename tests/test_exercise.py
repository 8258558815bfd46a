"""The exercise convention: the check runs on the student's function once it exists, else on the reference."""
import pytest

from kestrel_lab import exercise


def ref_square(x):
    return x * x


def _test(fn):
    assert fn(3) == 9
    return "fn(3) == 9"


def test_an_unimplemented_skeleton_checks_the_reference(capsys):
    def my_square(x):
        raise NotImplementedError("练习 A1：在这里写你的实现")

    assert exercise.check("A1", my_square, ref_square, _test) == exercise.REFERENCE
    out = capsys.readouterr().out
    assert "检查通过" in out and "参考答案" in out and "NotImplementedError" in out


def test_a_correct_answer_is_checked_as_the_students(capsys):
    assert exercise.check("A1", lambda x: x ** 2, ref_square, _test) == exercise.STUDENT
    assert "你的实现" in capsys.readouterr().out


def test_a_wrong_answer_fails_visibly():
    with pytest.raises(AssertionError):
        exercise.check("A1", lambda x: x + x, ref_square, _test)


def test_a_crashing_answer_is_not_mistaken_for_unfinished():
    def my_square(x):
        raise ValueError("bug")

    with pytest.raises(ValueError):
        exercise.check("A1", my_square, ref_square, _test)


def test_a_broken_reference_fails_the_build():
    def my_square(x):
        raise NotImplementedError

    with pytest.raises(AssertionError):
        exercise.check("A1", my_square, lambda x: 0, _test)
