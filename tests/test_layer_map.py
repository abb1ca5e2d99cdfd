import pytest

from distill.method.layer_map import build_layer_map


@pytest.mark.parametrize(
    "spec, n, m, expected",
    [
        ("uniform", 12, 4, [3, 6, 9, 12]),
        ("uniform", 6, 3, [2, 4, 6]),
        ("uniform", 6, 4, [2, 3, 5, 6]),  # 1.5, 3, 4.5, 6 rounded half up
        ("uniform", 12, 5, [2, 5, 7, 10, 12]),
        ("uniform", 6, 6, [1, 2, 3, 4, 5, 6]),
        ("last", 12, 4, [9, 10, 11, 12]),
        ("first", 12, 4, [1, 2, 3, 4]),
        ([2, 4, 5, 6], 6, 4, [2, 4, 5, 6]),
    ],
)
def test_layer_maps(spec, n, m, expected):
    assert build_layer_map(spec, n, m) == expected


def test_layer_map_errors_name_the_problem():
    with pytest.raises(ValueError, match="deeper than its teacher"):
        build_layer_map("uniform", 4, 6)
    with pytest.raises(ValueError, match="3 entries but the student has 4"):
        build_layer_map([1, 2, 3], 6, 4)
    with pytest.raises(ValueError, match=r"\[7\] are outside the teacher's layers 1..6"):
        build_layer_map([1, 2, 3, 7], 6, 4)
    with pytest.raises(ValueError, match="unknown layer_map"):
        build_layer_map("middle", 6, 4)
