package keyspace

// KeepByte is keepByte, for the encoder's tests.
var KeepByte = keepByte
