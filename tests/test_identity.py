import os
import pickle
import stat

import nacl.bindings
import pytest

import iac
from iac import Identity
from iac.wire import Domain
from iac.wire.identity import check_agent_id_cached, signing_input
from tools.vectors import points


def test_agent_id_is_lowercase_hex_of_public_key():
    ident = Identity.from_seed(bytes(range(32)))
    assert ident.agent_id == ident.public_key.hex()
    assert len(ident.agent_id) == 64
    assert iac.wire.is_agent_id(ident.agent_id)


@pytest.mark.parametrize(
    "bad",
    ["", "ab" * 31, "AB" * 32, "g" * 64, "0" * 65, " " + "0" * 63],
)
def test_malformed_agent_ids_are_refused(bad):
    assert not iac.wire.is_agent_id(bad)
    with pytest.raises(iac.errors.MessageRejected) as exc_info:
        iac.wire.check_agent_id(bad)
    assert exc_info.value.reason == "invalid_agent_id"


def test_sign_verify_round_trip_and_domain_separation():
    ident = Identity.generate()
    sig = ident.sign(Domain.MESSAGE, b"payload")
    iac.wire.verify(ident.agent_id, Domain.MESSAGE, b"payload", sig)
    # The same signature is worthless in any other role.
    for other in Domain:
        if other is not Domain.MESSAGE:
            with pytest.raises(iac.errors.MessageRejected) as exc_info:
                iac.wire.verify(ident.agent_id, other, b"payload", sig)
            assert exc_info.value.reason == "bad_signature"
    with pytest.raises(iac.errors.MessageRejected) as exc_info:
        iac.wire.verify(ident.agent_id, Domain.MESSAGE, b"payloaD", sig)
    assert exc_info.value.reason == "bad_signature"
    with pytest.raises(iac.errors.MessageRejected) as exc_info:
        iac.wire.verify(Identity.generate().agent_id, Domain.MESSAGE, b"payload", sig)
    assert exc_info.value.reason == "bad_signature"
    with pytest.raises(iac.errors.MessageRejected) as exc_info:
        iac.wire.verify(ident.agent_id, Domain.MESSAGE, b"payload", sig[:63])
    assert exc_info.value.reason == "bad_signature"


def test_signature_input_is_domain_nul_data():
    import nacl.signing

    seed = bytes(32)
    ident = Identity.from_seed(seed)
    expected = nacl.signing.SigningKey(seed).sign(b"iac-msg-v1\x00abc").signature
    assert ident.sign(Domain.MESSAGE, b"abc") == expected


# Keys that are 64 lowercase hex but not an AgentId: every point of small order, encodings
# that are not canonical, a y with no curve point, a point outside the prime-order subgroup.
_VALID = Identity.from_seed(bytes(range(32))).agent_id
BAD_KEYS = {
    **{f"small_order_{i}": key.hex() for i, key in enumerate(points.SMALL_ORDER)},
    "identity_with_sign_bit": "01" + "00" * 30 + "80",  # x = 0 with the sign bit: not canonical
    "minus_one_with_sign_bit": "ec" + "ff" * 31,  # the point of order 2, x = 0 with the sign bit
    "y_is_p": points.non_canonical(0).hex(),  # y = p: the point y = 0, encoded non-canonically
    "y_is_p_plus_1": points.non_canonical(1).hex(),  # the identity, non-canonically
    "y_is_p_plus_3": points.non_canonical(3).hex(),  # a curve point (y = 3) encoded as y + p
    "y_is_p_plus_3_sign": points.non_canonical(3, sign=True).hex(),
    "y_is_2_pow_255_minus_1": "ff" * 31 + "7f",
    "not_a_point": (2).to_bytes(32, "little").hex(),  # no x has y = 2
    "mixed_order": points.mixed_order(_VALID),  # a valid key plus a point of order 8
}


def test_bad_keys_are_what_their_names_say():
    assert points.has_point(3) and not points.has_point(2)
    for key in points.SMALL_ORDER:
        assert points.mul(8, points.decode(key)) == points.IDENTITY
    assert len(set(points.SMALL_ORDER)) == 8
    mixed = points.decode(bytes.fromhex(BAD_KEYS["mixed_order"]))
    assert mixed is not None and points.mul(points.L, mixed) != points.IDENTITY
    assert points.mul(8, mixed) == points.mul(8, points.decode(bytes.fromhex(_VALID)))
    for name in ("identity_with_sign_bit", "minus_one_with_sign_bit", "y_is_p", "y_is_p_plus_3"):
        assert points.decode(bytes.fromhex(BAD_KEYS[name])) is None, name


@pytest.mark.parametrize("key", BAD_KEYS.values(), ids=BAD_KEYS.keys())
def test_keys_that_are_not_points_of_the_prime_order_subgroup_are_refused_at_parse(key):
    assert not iac.wire.is_agent_id(key)
    with pytest.raises(iac.errors.MessageRejected, match="not a valid Ed25519 public key") as exc_info:
        iac.wire.check_agent_id(key)
    assert exc_info.value.reason == "invalid_agent_id"
    for _ in range(2):  # a refusal is not cached as a success
        with pytest.raises(iac.errors.MessageRejected) as exc_info:
            check_agent_id_cached(key)
        assert exc_info.value.reason == "invalid_agent_id"
    # refused as an AgentId before any signature is looked at
    with pytest.raises(iac.errors.MessageRejected) as exc_info:
        iac.wire.verify(key, Domain.MESSAGE, b"x", bytes(64))
    assert exc_info.value.reason == "invalid_agent_id"


def test_a_mixed_order_key_is_refused_though_its_signature_verifies():
    """libsodium's signature check accepts a key with an order-8 part; only the AgentId check refuses it."""
    agent_id, data, sig, _ = points.sign_mixed_order(
        bytes(range(32)), lambda i, _aid: signing_input(Domain.MESSAGE, b"attempt %d" % i)
    )
    assert agent_id == BAD_KEYS["mixed_order"]
    nacl.bindings.crypto_sign_open(sig + data, bytes.fromhex(agent_id))  # accepted by the signature check
    with pytest.raises(iac.errors.MessageRejected) as exc_info:
        iac.wire.verify(agent_id, Domain.MESSAGE, data[len(b"iac-msg-v1") + 1 :], sig)
    assert exc_info.value.reason == "invalid_agent_id"


def test_generated_keys_are_agent_ids():
    for n in range(64):
        agent_id = Identity.from_seed(bytes([n]) * 32).agent_id
        assert iac.wire.is_agent_id(agent_id)
        assert iac.wire.check_agent_id(agent_id) == check_agent_id_cached(agent_id) == agent_id


def test_agent_id_check_refuses_non_strings():
    for value in (None, 5, b"00" * 32, ["a" * 64]):
        assert not iac.wire.is_agent_id(value)  # type: ignore[arg-type]
        with pytest.raises(iac.errors.MessageRejected) as exc_info:
            iac.wire.check_agent_id(value)  # type: ignore[arg-type]
        assert exc_info.value.reason == "invalid_agent_id"


def test_repr_never_shows_the_secret():
    ident = Identity.from_seed(b"\x07" * 32)
    text = repr(ident) + str(ident)
    assert ident.agent_id in repr(ident)
    assert ident.seed().hex() not in text
    with pytest.raises(TypeError):
        pickle.dumps(ident)


def test_save_load_mode_0600(tmp_path):
    ident = Identity.generate()
    path = tmp_path / "agent.key"
    ident.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Identity.load(path).agent_id == ident.agent_id
    with pytest.raises(iac.errors.ConfigError, match="already exists") as exc_info:
        ident.save(path)
    assert exc_info.value.reason == "key_file_error"


def test_group_readable_key_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "agent.key"
    Identity.generate().save(path)
    os.chmod(path, 0o640)
    with pytest.raises(iac.errors.ConfigError) as info:
        Identity.load(path)
    assert info.value.reason == "key_file_error"
    assert str(path) in str(info.value)
    assert "chmod 600" in str(info.value)


def test_missing_and_garbage_key_files(tmp_path):
    with pytest.raises(iac.errors.ConfigError, match="iac keygen") as exc_info:
        Identity.load(tmp_path / "nope.key")
    assert exc_info.value.reason == "key_file_error"
    junk = tmp_path / "junk.key"
    junk.write_text("hello\n")
    os.chmod(junk, 0o600)
    with pytest.raises(iac.errors.ConfigError, match="not an IAC key file") as exc_info:
        Identity.load(junk)
    assert exc_info.value.reason == "key_file_error"
