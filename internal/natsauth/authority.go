package natsauth

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/onceflow/onceflow/internal/streams"
)

// accountName is the account every onceflow identity belongs to.
const accountName = "ONCEFLOW"

// Files of an Authority's directory: the seeds of its keys.
const (
	operatorFile = "operator.nk"
	systemFile   = "system.nk"
	accountFile  = "account.nk"
	signingFile  = "signing.nk"
)

// Authority holds the keys that make a NATS server trust onceflow's
// identities: the operator's, the system account's, the saga account's and
// the account's signing key, which signs the users. Replacing the signing
// key (Rotate) invalidates every user it signed, and leaves the account,
// and so its JetStream store, as it was.
type Authority struct {
	operator, system, account, signing nkeys.KeyPair
}

// New returns an Authority with new keys, held in memory only.
func New() (*Authority, error) {
	a := &Authority{}
	for _, k := range []struct {
		kp  *nkeys.KeyPair
		new func() (nkeys.KeyPair, error)
	}{
		{&a.operator, nkeys.CreateOperator},
		{&a.system, nkeys.CreateAccount},
		{&a.account, nkeys.CreateAccount},
		{&a.signing, nkeys.CreateAccount},
	} {
		kp, err := k.new()
		if err != nil {
			return nil, fmt.Errorf("create key: %w", err)
		}
		*k.kp = kp
	}
	return a, nil
}

// Open returns the Authority whose seeds are in dir, creating it (and dir)
// when dir holds none, so that a server restarted on the same store finds
// the same account.
func Open(dir string) (*Authority, error) {
	a := &Authority{}
	if _, err := os.Stat(filepath.Join(dir, operatorFile)); errors.Is(err, os.ErrNotExist) {
		if a, err = New(); err != nil {
			return nil, err
		}
		return a, a.save(dir, operatorFile, systemFile, accountFile, signingFile)
	}
	for file, kp := range a.keys() {
		seed, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			return nil, fmt.Errorf("read nats authority: %w", err)
		}
		if *kp, err = nkeys.FromSeed([]byte(strings.TrimSpace(string(seed)))); err != nil {
			return nil, fmt.Errorf("nats authority %s: %w", file, err)
		}
	}
	return a, nil
}

// Rotate replaces the signing key of the Authority in dir: the users it
// signed are refused once the server has the new ServerConfig.
func Rotate(dir string) (*Authority, error) {
	a, err := Open(dir)
	if err != nil {
		return nil, err
	}
	if a.signing, err = nkeys.CreateAccount(); err != nil {
		return nil, fmt.Errorf("create key: %w", err)
	}
	return a, a.save(dir, signingFile)
}

// keys are the Authority's keys by the file that holds their seed.
func (a *Authority) keys() map[string]*nkeys.KeyPair {
	return map[string]*nkeys.KeyPair{operatorFile: &a.operator, systemFile: &a.system, accountFile: &a.account, signingFile: &a.signing}
}

func (a *Authority) save(dir string, files ...string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	keys := a.keys()
	for _, file := range files {
		seed, err := (*keys[file]).Seed()
		if err != nil {
			return err
		}
		if err := writeSecret(filepath.Join(dir, file), seed); err != nil {
			return err
		}
	}
	return nil
}

// ServerConfig is the nats-server configuration that trusts the Authority:
// its operator, the system account, and the two accounts preloaded in a
// memory resolver, the saga's with JetStream. Include it in the server's
// configuration file.
func (a *Authority) ServerConfig() (string, error) {
	opPub, _ := a.operator.PublicKey()
	sysPub, _ := a.system.PublicKey()
	accPub, _ := a.account.PublicKey()
	sigPub, _ := a.signing.PublicKey()

	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = "onceflow"
	oc.SystemAccount = sysPub
	opJWT, err := oc.Encode(a.operator)
	if err != nil {
		return "", fmt.Errorf("operator jwt: %w", err)
	}
	sc := jwt.NewAccountClaims(sysPub)
	sc.Name = "SYS"
	sysJWT, err := sc.Encode(a.operator)
	if err != nil {
		return "", fmt.Errorf("system account jwt: %w", err)
	}
	ac := jwt.NewAccountClaims(accPub)
	ac.Name = accountName
	ac.SigningKeys.Add(sigPub)
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{
		MemoryStorage: jwt.NoLimit, DiskStorage: jwt.NoLimit, Streams: jwt.NoLimit, Consumer: jwt.NoLimit,
	}
	accJWT, err := ac.Encode(a.operator)
	if err != nil {
		return "", fmt.Errorf("account jwt: %w", err)
	}
	return fmt.Sprintf(`# Rendered by onceflow (package natsauth): who the server trusts. The
# users' permissions are in their JWTs, derived from the topology.
operator: %s
system_account: %s
# A CONNECT carries the user's JWT, whose permissions list every subject
# it may use: more than the default 4 KiB for the operator.
max_control_line: 65536
resolver: MEMORY
resolver_preload: {
  %s: %s
  %s: %s
}
`, opJWT, sysPub, sysPub, sysJWT, accPub, accJWT), nil
}

// Creds issues new credentials for identity with the permissions p: the
// contents of a .creds file, a user JWT signed by the account's signing key
// and the user's seed.
func (a *Authority) Creds(identity string, p streams.Permissions) ([]byte, error) {
	user, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("create user key: %w", err)
	}
	pub, _ := user.PublicKey()
	accPub, _ := a.account.PublicKey()
	uc := jwt.NewUserClaims(pub)
	uc.Name = identity
	uc.IssuerAccount = accPub
	uc.Pub.Allow.Add(p.Publish...)
	uc.Pub.Deny.Add(p.DenyPublish...)
	uc.Sub.Allow.Add(p.Subscribe...)
	userJWT, err := uc.Encode(a.signing)
	if err != nil {
		return nil, fmt.Errorf("user jwt for %s: %w", identity, err)
	}
	seed, err := user.Seed()
	if err != nil {
		return nil, err
	}
	return jwt.FormatUserConfig(userJWT, seed)
}

// Admin is the identity of tests' own connections, which may do anything
// in the account (set up streams, inject faults). No process of onceflow
// gets it.
const Admin = "admin"

// WriteCreds issues credentials for every identity of t (each service, the
// provisioner, the operator) and for the identities named besides (Admin,
// or a service with no stream nor durable, which may only connect), into
// dir as <identity>.creds, readable by the owner only. It returns their
// paths by identity.
func (a *Authority) WriteCreds(dir string, t streams.Topology, more ...string) (map[string]string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	perms := map[string]streams.Permissions{}
	for _, id := range append(t.Identities(), more...) {
		if id == Admin {
			perms[id] = streams.Permissions{Publish: []string{">"}, Subscribe: []string{">"}}
			continue
		}
		perms[id] = t.Permissions(id)
	}
	paths := map[string]string{}
	for id, p := range perms {
		creds, err := a.Creds(id, p)
		if err != nil {
			return nil, err
		}
		paths[id] = filepath.Join(dir, id+".creds")
		if err := writeSecret(paths[id], creds); err != nil {
			return nil, err
		}
	}
	return paths, nil
}

// writeSecret writes a file only its owner can read.
func writeSecret(path string, content []byte) error {
	if err := os.WriteFile(path, content, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
