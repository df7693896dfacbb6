"""Generators of the test vectors in proto/testvectors/ (deterministic: fixed seeds and clocks).

* :mod:`tools.vectors.wire`: ``v1.json`` (frames, signed messages, HELLOs), written by
  ``tools/make_testvectors.py``;
* :mod:`tools.vectors.payloads`: ``payloads-v1.json`` (recorded from a real node, through
  :mod:`tools.vectors.payload_harness`), with the payload schemas in
  :mod:`tools.vectors.payload_schemas`;
* :mod:`tools.vectors.records`: ``records-v1.json`` (signed records, rotations, revocations);
* :mod:`tools.vectors.mesh`: ``mesh-v1.json`` (FILE_TRANSFER payloads, FORWARD wrappers).
"""
