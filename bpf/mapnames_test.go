package bpf

import "testing"

// TestMapNamesOneList: every map of the object is in pinnedMaps or is one of the maps that
// live only as long as the programs (scratch space, per-CPU rings, fragment tables, built
// empty at each load); every listed map is in the object, once. A new map must be added to
// one of the two.
func TestMapNamesOneList(t *testing.T) {
	unpinned := map[string]bool{"sl_scratch": true, "sl_scratch_ct6": true, "sl_ct_cleanq": true, "sl_ct_cleanq6": true,
		"sl_ct_young_v4": true, "sl_ct_young_v6": true, "sl_ct_young_pos": true, "sl_ct_young_pos6": true, "sl_scratch6": true,
		"sl_frag_v4": true, "sl_frag_v6": true}
	spec, err := loadSluice()
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, m := range pinnedMaps {
		if listed[m.name] {
			t.Errorf("%s listed twice", m.name)
		}
		listed[m.name] = true
		if spec.Maps[m.name] == nil {
			t.Errorf("%s is listed but not in the object", m.name)
		}
		if m.optional && !m.v6 {
			t.Errorf("%s: only IPv6 maps may be optional", m.name)
		}
	}
	for name := range spec.Maps {
		if !listed[name] && !unpinned[name] {
			t.Errorf("map %s is in neither pinnedMaps nor the unpinned maps", name)
		}
	}
	for name := range unpinned {
		if spec.Maps[name] == nil {
			t.Errorf("unpinned map %s is not in the object", name)
		}
	}
}
