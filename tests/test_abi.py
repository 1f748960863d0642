from factory.abi import ScalarArg, Signature, TensorArg


def test_signature_round_trips_through_json():
    sig = Signature((TensorArg("a", "bf16", ("M", "K", "L"), ("sAm", 1, "sAl")), ScalarArg("scale", "f32")),
                    (("K", 8), ("sAm", 8)))
    back = Signature.from_json(sig.to_json())
    assert back == sig
    assert back.symbols() == ["M", "K", "L", "sAm", "sAl"]
    assert back.divisor("K") == 8 and back.divisor("M") == 1
