import iac
from iac.errors import all_error_classes


def test_every_error_is_rooted_at_iac_error_and_has_a_unique_name():
    classes = all_error_classes()
    names = [c.name for c in classes]
    assert len(names) == len(set(names))
    assert all(issubclass(c, iac.IacError) for c in classes)
    for c in classes:
        assert c.name.islower() and " " not in c.name


def test_protocol_errors_carry_close_codes_and_are_split_by_fault():
    for c in all_error_classes():
        if issubclass(c, iac.errors.ProtocolError):
            assert isinstance(c.close_code, iac.errors.CloseCode)
            assert c.close_code != iac.errors.CloseCode.NO_ERROR
            assert issubclass(c, iac.errors.PeerError)
            assert not issubclass(c, iac.errors.LocalError | iac.TransportError | iac.errors.MessageRejected)
    assert iac.errors.DecompressionBomb.close_code == iac.errors.CloseCode.FRAME_TOO_LARGE
    assert issubclass(iac.errors.BadSignature, iac.errors.MessageRejected)
    assert not issubclass(iac.errors.BadSignature, iac.errors.ProtocolError)


def test_iac_errors_exports_every_error():
    missing = [c.__name__ for c in all_error_classes() if getattr(iac.errors, c.__name__, None) is not c]
    assert missing == []
    assert {c.__name__ for c in all_error_classes()} <= set(iac.errors.__all__)


def test_protocol_doc_lists_every_error_and_close_code():
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "PROTOCOL.md").read_text()
    for c in all_error_classes():
        assert f"`{c.name}`" in doc, c.name
    for code in iac.errors.CloseCode:
        if code not in (iac.errors.CloseCode.NO_ERROR,):
            assert f"0x{code:02x}" in doc.lower() or code.name in doc, code.name
