package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// TLSFiles names the PEM files written by WriteTLSFiles.
type TLSFiles struct {
	Dir            string
	CAFile         string
	ServerCertFile string
	ServerKeyFile  string
	ClientCertFile string
	ClientKeyFile  string
}

// ClientCommonName is the subject CN of the client certificate. It is no
// etcd user, so a client that presents only the certificate gets no
// rights once auth is enabled.
const ClientCommonName = "etcdtest-client"

// WriteTLSFiles writes a throwaway CA, a server certificate for
// 127.0.0.1, ::1 and localhost, and a client certificate into dir
// (created if needed). All keys are ECDSA P-256; the certificates are
// valid for one hour.
func WriteTLSFiles(dir string) (*TLSFiles, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("etcdtest: tls dir: %w", err)
	}
	f := &TLSFiles{
		Dir:            dir,
		CAFile:         filepath.Join(dir, "ca.pem"),
		ServerCertFile: filepath.Join(dir, "server.pem"),
		ServerKeyFile:  filepath.Join(dir, "server-key.pem"),
		ClientCertFile: filepath.Join(dir, "client.pem"),
		ClientKeyFile:  filepath.Join(dir, "client-key.pem"),
	}
	now := time.Now()
	notBefore, notAfter := now.Add(-time.Minute), now.Add(time.Hour)

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "etcdtest CA"},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("etcdtest: CA certificate: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	if err := writePEM(f.CAFile, "CERTIFICATE", caDER, 0o644); err != nil {
		return nil, err
	}

	// The server certificate is also used by etcd's own gateway as a
	// client certificate, hence ClientAuth too.
	server := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:     []string{"localhost"},
	}
	if err := issue(server, caCert, caKey, f.ServerCertFile, f.ServerKeyFile); err != nil {
		return nil, err
	}
	client := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: ClientCommonName},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if err := issue(client, caCert, caKey, f.ClientCertFile, f.ClientKeyFile); err != nil {
		return nil, err
	}
	return f, nil
}

// ClientConfig returns a client TLS config that trusts the CA and
// presents the client certificate.
func (f *TLSFiles) ClientConfig() (*tls.Config, error) {
	tc, err := f.CAConfig()
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(f.ClientCertFile, f.ClientKeyFile)
	if err != nil {
		return nil, fmt.Errorf("etcdtest: client certificate: %w", err)
	}
	tc.Certificates = []tls.Certificate{cert}
	return tc, nil
}

// CAConfig returns a client TLS config that trusts the CA but presents
// no certificate.
func (f *TLSFiles) CAConfig() (*tls.Config, error) {
	caPEM, err := os.ReadFile(f.CAFile)
	if err != nil {
		return nil, fmt.Errorf("etcdtest: CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("etcdtest: CA file holds no certificate")
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

func issue(tmpl, ca *x509.Certificate, caKey *ecdsa.PrivateKey, certFile, keyFile string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("etcdtest: certificate %s: %w", tmpl.Subject.CommonName, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := writePEM(certFile, "CERTIFICATE", der, 0o644); err != nil {
		return err
	}
	return writePEM(keyFile, "PRIVATE KEY", keyDER, 0o600)
}

func writePEM(path, typ string, der []byte, perm os.FileMode) error {
	data := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, data, perm); err != nil {
		return fmt.Errorf("etcdtest: %w", err)
	}
	return nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}
