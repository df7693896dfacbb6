"""The parts of proto/testvectors/v1.json (written by tools/make_testvectors.py).

* :mod:`tools.vectors.wire.common`: fixed identities, the vector dictionary, hand-built
  protobuf fields, frames and zstd frames, and the JSON form of a message;
* :mod:`tools.vectors.wire.positive`: signed messages, HELLOs and the frames a receiver must
  accept although a canonical serializer would never produce them;
* :mod:`tools.vectors.wire.negative`: the frames every receiver must refuse.
"""
