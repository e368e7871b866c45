package auth

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"

	"github.com/onceflow/onceflow/internal/httpserve"
)

// Paths of the dev issuer's endpoints.
const (
	JWKSPath  = "/.well-known/jwks.json"
	TokenPath = "/token"
)

// IssuerConfig configures the dev issuer.
type IssuerConfig struct {
	// Issuer is the iss of the tokens, e.g. http://127.0.0.1:8084: what the
	// services' AUTH_ISSUER must say.
	Issuer string `env:"AUTH_ISSUER"`
	// Audience is the aud of the tokens.
	Audience string `env:"AUTH_AUDIENCE" envDefault:"onceflow"`
	// TTL is how long a token is valid.
	TTL time.Duration `env:"AUTH_TOKEN_TTL" envDefault:"12h"`
	// OperatorSecret is what a caller of POST /token presents (as a
	// bearer token) to be given an admin token; empty, one is made at
	// start (OperatorSecret returns it).
	OperatorSecret string `env:"ISSUER_OPERATOR_SECRET"`
	// Hosts are the Host headers POST /token answers besides the issuer
	// URL's own (and, for a loopback or unspecified one, the loopback
	// names with its port): a page of another site whose name resolves to
	// the issuer (DNS rebinding) gets no token.
	Hosts []string `env:"ISSUER_HOSTS"`
}

// TokenRequest is what a token says.
type TokenRequest struct {
	Subject string
	Email   string
	// EmailVerified, when set, is the token's email_verified claim, as an
	// OIDC provider writes it; nil writes none.
	EmailVerified *bool
	Admin         bool
}

// Issuer is the dev identity provider: an RSA key made at start (and at
// each Rotate), the JWKS of every key it has had, and tokens signed with the
// newest. It is safe for concurrent use.
type Issuer struct {
	cfg   IssuerConfig
	hosts []string
	jwks  *jwkset.MemoryJWKSet

	mu  sync.Mutex
	key *rsa.PrivateKey
	kid string
}

// NewIssuer returns an issuer with a fresh signing key.
func NewIssuer(ctx context.Context, cfg IssuerConfig) (*Issuer, error) {
	if cfg.Issuer == "" {
		return nil, errors.New("issuer: the issuer (iss) is required")
	}
	cfg.Audience = cmp.Or(cfg.Audience, DefaultAudience)
	cfg.TTL = cmp.Or(cfg.TTL, 12*time.Hour)
	cfg.OperatorSecret = cmp.Or(cfg.OperatorSecret, rand.Text())
	hosts, err := issuerHosts(cfg)
	if err != nil {
		return nil, err
	}
	i := &Issuer{cfg: cfg, hosts: hosts, jwks: jwkset.NewMemoryStorage()}
	if err := i.Rotate(ctx); err != nil {
		return nil, err
	}
	return i, nil
}

// Rotate makes a new signing key for the tokens from now on. The JWKS keeps
// the earlier keys, so that tokens already issued stay valid.
func (i *Issuer) Rotate(ctx context.Context) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("issuer: generate key: %w", err)
	}
	kid := uuid.NewString()
	jwk, err := jwkset.NewJWKFromKey(key, jwkset.JWKOptions{
		Metadata: jwkset.JWKMetadataOptions{KID: kid, ALG: jwkset.AlgRS256, USE: jwkset.UseSig},
	})
	if err != nil {
		return fmt.Errorf("issuer: key set entry: %w", err)
	}
	if err := i.jwks.KeyWrite(ctx, jwk); err != nil {
		return fmt.Errorf("issuer: key set: %w", err)
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	i.key, i.kid = key, kid
	return nil
}

// TTL is how long the tokens it issues are valid.
func (i *Issuer) TTL() time.Duration { return i.cfg.TTL }

// OperatorSecret is what POST /token wants, as a bearer token, to issue an
// admin token.
func (i *Issuer) OperatorSecret() string { return i.cfg.OperatorSecret }

// issuerHosts are the Host headers POST /token answers: the issuer URL's,
// the loopback names with its port when it is a loopback or unspecified
// address, and cfg.Hosts.
func issuerHosts(cfg IssuerConfig) ([]string, error) {
	u, err := url.Parse(cfg.Issuer)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("issuer: the issuer %q is no URL", cfg.Issuer)
	}
	hosts := append([]string{u.Host}, cfg.Hosts...)
	if ip := net.ParseIP(u.Hostname()); ip != nil && (ip.IsLoopback() || ip.IsUnspecified()) || u.Hostname() == "localhost" {
		port := cmp.Or(u.Port(), map[string]string{"https": "443"}[u.Scheme], "80")
		hosts = append(hosts, "localhost:"+port, "127.0.0.1:"+port, "[::1]:"+port)
		if u.Port() == "" {
			hosts = append(hosts, "localhost", "127.0.0.1", "[::1]")
		}
	}
	return hosts, nil
}

// Token signs a token for r, valid from now for the issuer's TTL.
func (i *Issuer) Token(r TokenRequest) (string, error) {
	if r.Subject == "" || len(r.Subject) > maxSubjectLength {
		return "", fmt.Errorf("issuer: sub must be 1 to %d characters", maxSubjectLength)
	}
	if len(r.Email) > MaxEmailLength {
		return "", fmt.Errorf("issuer: email must be at most %d characters", MaxEmailLength)
	}
	now := time.Now()
	c := claims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    i.cfg.Issuer,
			Subject:   r.Subject,
			Audience:  jwt.ClaimStrings{i.cfg.Audience},
			IssuedAt:  jwt.NewNumericDate(now),
			NotBefore: jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(i.cfg.TTL)),
			ID:        uuid.NewString(),
		},
		Email: r.Email,
	}
	if r.EmailVerified != nil {
		c.EmailVerified = *r.EmailVerified
	}
	if r.Admin {
		c.Roles = jwt.ClaimStrings{RoleAdmin}
	}
	return i.sign(c)
}

// sign signs c with the newest key, named in the header.
func (i *Issuer) sign(c jwt.Claims) (string, error) {
	i.mu.Lock()
	key, kid := i.key, i.kid
	i.mu.Unlock()
	t := jwt.NewWithClaims(jwt.SigningMethodRS256, c)
	t.Header[jwkset.HeaderKID] = kid
	s, err := t.SignedString(key)
	if err != nil {
		return "", fmt.Errorf("issuer: sign: %w", err)
	}
	return s, nil
}

// TokenResponse is the answer of POST /token, as OAuth 2.0's (RFC 6749, 5.1).
type TokenResponse struct {
	AccessToken string `json:"access_token"`
	TokenType   string `json:"token_type"`
	ExpiresIn   int64  `json:"expires_in"`
}

// Handler serves GET /.well-known/jwks.json, POST /token (form fields sub,
// role=admin and email, the last two optional; role=admin only with the
// operator secret as a bearer token) and GET /healthz. POST /token answers
// only requests for the issuer's own host names; the keys and the health
// are public, and the services fetch the keys by whatever name their
// network gives the issuer.
func (i *Issuer) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+JWKSPath, i.serveJWKS)
	mux.HandleFunc("POST "+TokenPath, i.serveToken)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	return mux
}

func (i *Issuer) serveJWKS(w http.ResponseWriter, r *http.Request) {
	b, err := i.jwks.JSONPublic(r.Context())
	if err != nil {
		http.Error(w, "key set: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

func (i *Issuer) serveToken(w http.ResponseWriter, r *http.Request) {
	if !slices.ContainsFunc(i.hosts, func(h string) bool { return strings.EqualFold(h, r.Host) }) {
		writeJSON(w, http.StatusMisdirectedRequest, map[string]string{"error": "invalid_request", "error_description": "this issuer does not answer to that host name"})
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if err := r.ParseForm(); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_request", "error_description": err.Error()})
		return
	}
	role := r.PostForm.Get("role")
	if role != "" && role != RoleAdmin {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_request", "error_description": `role must be "admin" or absent`})
		return
	}
	if role == RoleAdmin && !i.operator(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="onceflow dev issuer"`)
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "invalid_client",
			"error_description": "an admin token needs the run's operator secret: Authorization: Bearer <secret> (onceflow dev prints it; the issuer logs it)"})
		return
	}
	token, err := i.Token(TokenRequest{Subject: r.PostForm.Get("sub"), Email: r.PostForm.Get("email"), Admin: role == RoleAdmin})
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_request", "error_description": err.Error()})
		return
	}
	// Tokens are credentials: no cache may keep them (RFC 6749, 5.1).
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, TokenResponse{AccessToken: token, TokenType: "Bearer", ExpiresIn: int64(i.cfg.TTL.Seconds())})
}

// operator reports whether r presents the operator secret as its bearer
// token.
func (i *Issuer) operator(r *http.Request) bool {
	secret, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(strings.TrimSpace(secret)), []byte(i.cfg.OperatorSecret)) == 1
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// shutdownGrace is how long a stopping issuer lets a request finish before
// it closes the connections left.
const shutdownGrace = 5 * time.Second

// Serve serves the issuer's endpoints on ln until ctx ends. Whoever fetches
// its key set should stop first (dev stops the services, then the issuer).
func (i *Issuer) Serve(ctx context.Context, ln net.Listener, logger *slog.Logger) error {
	srv := &http.Server{
		Handler:           i.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	if err := httpserve.Serve(ctx, srv, ln, shutdownGrace, logger); err != nil {
		return fmt.Errorf("issuer: %w", err)
	}
	return nil
}
