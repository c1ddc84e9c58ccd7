"""Visible tests for lab 06 (a useful subset; the hidden graders check more).

Run: pytest labs/06                                  (all)
     pytest labs/06 -k "quantize and not linear"     (part A)
     pytest labs/06 -k pack                          (part B)
     pytest labs/06 -k linear                        (part C)
"""
import torch
import pytest

from harness.toolkit import expect_raises


@pytest.mark.part("A")
def test_quantize_symmetric_int8_per_row(impl):
    w = torch.tensor([[0.5, -1.0, 0.25, 0.0], [2.0, 1.0, -0.5, 0.125]])
    codes, scale = impl.quantize_symmetric(w, bits=8)
    assert codes.dtype == torch.int8 and scale.dtype == torch.float32
    assert scale.shape == (2, 1), "one scale per row when group_size=None: shape (out, 1)"
    assert torch.allclose(scale[:, 0], torch.tensor([1.0, 2.0]) / 127)
    assert codes[0].tolist() == [64, -127, 32, 0], "codes = round(w / scale) (round to nearest)"


@pytest.mark.part("A")
def test_quantize_symmetric_groups_and_zero_group(impl):
    w = torch.zeros(2, 8)
    w[1, 4:] = torch.tensor([0.7, -0.1, 0.2, 0.3])
    codes, scale = impl.quantize_symmetric(w, bits=4, group_size=4)
    assert scale.shape == (2, 2)
    assert not torch.isnan(scale).any() and (scale[0] == 0).all(), "an all-zero group gets scale 0, never NaN"
    assert codes.abs().max() <= 7, "int4 symmetric codes are in [-7, 7]"
    assert (codes[0] == 0).all()


@pytest.mark.part("A")
def test_quantize_asymmetric_keeps_zero_exact(impl):
    w = torch.tensor([[0.0, 0.3, 0.6, 1.5], [-1.0, 0.0, 0.25, 0.5]])
    codes, scale, zp = impl.quantize_asymmetric(w, bits=4, group_size=None)
    assert codes.dtype == torch.uint8 and zp.dtype == torch.uint8 and zp.shape == scale.shape
    deq = impl.dequantize(codes, scale, zp)
    assert deq[0, 0] == 0 and deq[1, 1] == 0, "0 must dequantize to exactly 0 (code == zero point)"
    assert ((w - deq).abs() <= scale / 2 + 1e-6).all(), "error must stay within scale / 2"


@pytest.mark.part("A")
def test_quantize_group_size_must_divide(impl):
    expect_raises(ValueError, "quantize_symmetric of a (2, 10) weight with group_size=4 (4 does not divide 10)",
                  impl.quantize_symmetric, torch.randn(2, 10), bits=8, group_size=4)


@pytest.mark.part("B")
def test_pack_int4_handout_example(impl):
    packed = impl.pack_int4(torch.tensor([1, 2, 3, 4]))
    assert packed.dtype == torch.uint8 and packed.tolist() == [0x21, 0x43], \
        f"element 2i goes to the low nibble: [1, 2, 3, 4] -> [0x21, 0x43], got {[hex(x) for x in packed.tolist()]}"
    assert impl.unpack_int4(packed).tolist() == [1, 2, 3, 4]


@pytest.mark.part("B")
def test_pack_int4_errors(impl):
    expect_raises(TypeError, "pack_int4 of float codes", impl.pack_int4, torch.tensor([1.0, 2.0]))
    expect_raises(ValueError, "pack_int4 of an odd number of codes", impl.pack_int4, torch.tensor([1, 2, 3]))
    expect_raises(ValueError, "pack_int4 of the code 16 (int4 codes are 0..15)", impl.pack_int4, torch.tensor([1, 16]))


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.part("C")
def test_quantized_linear_close_to_float(impl, bits):
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 16)
    q = impl.QuantizedLinear.from_linear(lin, bits=bits)
    x = torch.randn(3, 256)
    err = (q(x) - lin(x)).abs().max().item()
    assert err < (0.02 if bits == 8 else 0.2), f"bits={bits}: output differs from the float layer by {err}"
