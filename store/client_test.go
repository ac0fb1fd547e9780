package store_test

import (
	"reflect"
	"testing"

	"github.com/sluice-net/sluice/store"
)

func TestClientConfigPrecedence(t *testing.T) {
	env := map[string]string{
		"SLUICE_ETCD_ENDPOINTS": "http://10.0.0.1:2379, http://10.0.0.2:2379",
		"ETCDCTL_ENDPOINTS":     "http://ignored:2379",
		"ETCD_ENDPOINTS":        "http://ignored-too:2379",
		"ETCDCTL_CACERT":        "/etc/etcd/ca.pem",
		"ETCD_CA_CERT_FILE":     "/ignored/ca.pem",
		"ETCD_CERT_FILE":        "/etc/calico/cert.pem",
		"ETCD_KEY_FILE":         "/etc/calico/key.pem",
		"ETCDCTL_USER":          "alice:wonder",
	}
	got := store.ClientConfig{Username: "bob"}.WithEnv(func(k string) string { return env[k] })
	want := store.ClientConfig{
		Endpoints: []string{"http://10.0.0.1:2379", "http://10.0.0.2:2379"},
		CACert:    "/etc/etcd/ca.pem", Cert: "/etc/calico/cert.pem", Key: "/etc/calico/key.pem",
		Username: "bob", // a flag beats the environment
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	got = store.ClientConfig{}.WithEnv(func(k string) string { return env[k] })
	if got.Username != "alice" || got.Password != "wonder" {
		t.Fatalf("ETCDCTL_USER user:password gave %q %q", got.Username, got.Password)
	}
	got = store.ClientConfig{Endpoints: []string{"http://flag:2379"}}.WithEnv(func(string) string { return "" })
	if !reflect.DeepEqual(got.Endpoints, []string{"http://flag:2379"}) {
		t.Fatalf("flag endpoints lost: %v", got.Endpoints)
	}
	if got := (store.ClientConfig{}).WithEnv(func(string) string { return "" }); !reflect.DeepEqual(got.Endpoints, []string{store.DefaultEndpoint}) {
		t.Fatalf("default endpoints = %v", got.Endpoints)
	}
	if _, err := (store.ClientConfig{Cert: "/x"}).TLS(); err == nil {
		t.Fatal("a certificate without a key was accepted")
	}
	if _, err := (store.ClientConfig{CACert: "/does/not/exist"}).TLS(); err == nil {
		t.Fatal("a missing CA file was accepted")
	}
}
