package dataplane

// emptied returns m emptied: cleared when it is small, a new map when it held many keys. A Go
// map never gives back its buckets, and ranging over it costs its capacity, so a set that held
// a cold start's 20,000 keys would make every later small apply walk 20,000 empty slots.
func emptied[K comparable, V any](m map[K]V) map[K]V {
	if len(m) > 1024 {
		return map[K]V{}
	}
	clear(m)
	return m
}
