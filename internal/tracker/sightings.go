package tracker

// Sightings turns the findings of repeated scans (leftovers of other software) into reports:
// each thing once when it appears and once when it goes. A thing judged otherwise than at the
// last scan (its effect changed: breaking, dormant) goes and appears again, so whatever counts
// by effect stays right. A thing the caller removed during the scan is reported once as found
// (the report says it was removed) and, if seen before, as gone too.
type Sightings[T any] struct {
	known map[string]T
}

// Pass takes one scan's findings; key identifies a thing across scans, effect is its current
// judgement, removed says whether the caller removed it during the scan. report is called for
// each change, with gone set for a thing no longer found (or judged otherwise).
func (s *Sightings[T]) Pass(found []T, key, effect func(T) string, removed func(T) bool, report func(t T, gone bool)) {
	seen := make(map[string]T, len(found))
	for _, t := range found {
		if removed(t) {
			report(t, false)
			continue
		}
		k := key(t)
		if old, known := s.known[k]; !known || effect(old) != effect(t) {
			if known {
				report(old, true)
			}
			report(t, false)
		}
		seen[k] = t
	}
	for k, t := range s.known {
		if _, still := seen[k]; !still {
			report(t, true)
		}
	}
	s.known = seen
}
