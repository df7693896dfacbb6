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
        if issubclass(c, iac.ProtocolError):
            assert isinstance(c.close_code, iac.CloseCode)
            assert c.close_code != iac.CloseCode.NO_ERROR
            assert issubclass(c, iac.PeerError)
            assert not issubclass(c, iac.LocalError | iac.TransportError | iac.MessageRejected)
    assert iac.DecompressionBomb.close_code == iac.CloseCode.FRAME_TOO_LARGE
    assert issubclass(iac.BadSignature, iac.MessageRejected)
    assert not issubclass(iac.BadSignature, iac.ProtocolError)


def test_public_api_exports_every_error():
    missing = [c.__name__ for c in all_error_classes() if getattr(iac, c.__name__, None) is not c]
    assert missing == []


def test_protocol_doc_lists_every_error_and_close_code():
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "PROTOCOL.md").read_text()
    for c in all_error_classes():
        assert f"`{c.name}`" in doc, c.name
    for code in iac.CloseCode:
        if code not in (iac.CloseCode.NO_ERROR,):
            assert f"0x{code:02x}" in doc.lower() or code.name in doc, code.name
