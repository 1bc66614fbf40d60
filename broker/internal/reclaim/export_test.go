package reclaim

// DecodeBatchSample exposes decodeBatchSample to the external tests.
var DecodeBatchSample = decodeBatchSample
