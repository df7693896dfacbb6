"""The contenders: baselines users would pick instead (HTTP+JSON, gRPC, NATS, ZeroMQ), the floors
(the least a signed protocol on the same transport must cost) and IAC nodes, as endpoints the
scenarios drive. Imports the harness only."""
