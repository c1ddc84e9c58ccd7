"""Bug: quantize_asymmetric never adds the zero point to its codes (codes = clamp(round(w / scale),
0, 2**bits - 1)) but returns it, so negative weights clip to code 0 and dequantizing subtracts a
zero point the codes never got.

Issue "one bug graded in one place, and messages that name the bug class": graded by the
asymmetric-code tests of part A, and every test it fails names it ("zero point never added"): the
value tests that need negative weights (codes, round to nearest and 0 exact, zero/constant groups)
through their oracle's known-bug list, the int4 SQNR floor and QuantizedLinear's bits=4 forward by
replaying the bug. The tests of other behaviours use weights whose zero points are all 0, where it
cannot matter, and pass: the scale-shape test, the min-0 and all-positive group tests, the
bits=4 nonneg forward case and the storage tests."""
MUTATE = [("    codes = (torch.round(wg / safe[..., None]) + zero_point[..., None]).clamp(0, qmax)",
           "    codes = torch.round(wg / safe[..., None]).clamp(0, qmax)")]
BUG = True
MESSAGE = "zero point never added"  # the bug class, named in every failing test
MAY_FAIL = ["test_asymmetric_codes_zero_point_dtypes_and_ranges",
            "test_asymmetric_round_to_nearest_within_half_scale_and_zero_exact",
            "test_zero_and_constant_groups_never_make_nan_or_inf", "test_sqnr_floor_on_gaussian_rows_of_4096",
            "test_from_linear_forward_equals_x_times_dequantized_weight"]
SELECT = ("group_size_not_dividing or asymmetric or scale_shape or (sqnr and asym) or from_linear "
          "or (weight_storage and bits4) or dequantize_matches")
