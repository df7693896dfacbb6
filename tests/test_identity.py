import os
import pickle
import stat

import pytest

import iac
from iac import Identity
from iac.wire import Domain


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
    with pytest.raises(iac.errors.InvalidAgentId):
        iac.wire.check_agent_id(bad)


def test_sign_verify_round_trip_and_domain_separation():
    ident = Identity.generate()
    sig = ident.sign(Domain.MESSAGE, b"payload")
    iac.wire.verify(ident.agent_id, Domain.MESSAGE, b"payload", sig)
    # The same signature is worthless in any other role.
    for other in Domain:
        if other is not Domain.MESSAGE:
            with pytest.raises(iac.errors.BadSignature):
                iac.wire.verify(ident.agent_id, other, b"payload", sig)
    with pytest.raises(iac.errors.BadSignature):
        iac.wire.verify(ident.agent_id, Domain.MESSAGE, b"payloaD", sig)
    with pytest.raises(iac.errors.BadSignature):
        iac.wire.verify(Identity.generate().agent_id, Domain.MESSAGE, b"payload", sig)
    with pytest.raises(iac.errors.BadSignature):
        iac.wire.verify(ident.agent_id, Domain.MESSAGE, b"payload", sig[:63])


def test_signature_input_is_domain_nul_data():
    import nacl.signing

    seed = bytes(32)
    ident = Identity.from_seed(seed)
    expected = nacl.signing.SigningKey(seed).sign(b"iac-msg-v1\x00abc").signature
    assert ident.sign(Domain.MESSAGE, b"abc") == expected


def test_small_order_public_key_is_refused():
    # The identity point (small order): libsodium refuses it whatever the signature.
    small_order = "01" + "00" * 31
    with pytest.raises(iac.errors.BadSignature):
        iac.wire.verify(small_order, Domain.MESSAGE, b"x", bytes(64))


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
    with pytest.raises(iac.errors.KeyFileError, match="already exists"):
        ident.save(path)


def test_group_readable_key_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "agent.key"
    Identity.generate().save(path)
    os.chmod(path, 0o640)
    with pytest.raises(iac.errors.KeyFileError) as info:
        Identity.load(path)
    assert str(path) in str(info.value)
    assert "chmod 600" in str(info.value)


def test_missing_and_garbage_key_files(tmp_path):
    with pytest.raises(iac.errors.KeyFileError, match="iac keygen"):
        Identity.load(tmp_path / "nope.key")
    junk = tmp_path / "junk.key"
    junk.write_text("hello\n")
    os.chmod(junk, 0o600)
    with pytest.raises(iac.errors.KeyFileError, match="not an IAC key file"):
        Identity.load(junk)
