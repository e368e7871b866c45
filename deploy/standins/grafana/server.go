package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// server answers the part of Grafana's HTTP API that the stand-in has.
type server struct {
	prov     provisioning
	homePath string
	logger   *slog.Logger
}

func newServer(prov provisioning, homePath string, logger *slog.Logger) http.Handler {
	s := &server{prov: prov, homePath: homePath, logger: logger}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.index)
	mux.HandleFunc("GET /api/health", s.health)
	mux.HandleFunc("GET /api/search", s.search)
	mux.HandleFunc("GET /api/dashboards/uid/{uid}", s.dashboardByUID)
	mux.HandleFunc("GET /api/dashboards/home", s.home)
	mux.HandleFunc("GET /api/datasources", s.datasources)
	mux.HandleFunc("GET /api/datasources/uid/{uid}", s.datasourceByUID)
	mux.HandleFunc("GET /api/datasources/proxy/uid/{uid}/{path...}", s.proxy)
	mux.HandleFunc("POST /api/datasources/proxy/uid/{uid}/{path...}", s.proxy)
	return mux
}

// index says what this is: a browser finds no UI here.
func (s *server) index(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintln(w, "onceflow's stand-in for Grafana: its HTTP API for the provisioned dashboards and data sources, no UI (see docs/compose.md).")
	for _, d := range s.prov.dashboards {
		fmt.Fprintf(w, "dashboard %q: /api/dashboards/uid/%s\n", d.title, d.uid)
	}
	for _, ds := range s.prov.datasources {
		fmt.Fprintf(w, "data source %q (%s): /api/datasources/proxy/uid/%s/\n", ds.Name, ds.Type, ds.UID)
	}
}

func (s *server) health(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"database": "ok", "version": "onceflow-standin", "commit": "onceflow-standin"})
}

// search lists the dashboards whose title contains query, with every tag
// asked for, as /api/search's "dash-db" hits.
func (s *server) search(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	hits := []map[string]any{}
	if typ := q.Get("type"); typ != "" && typ != "dash-db" {
		writeJSON(w, http.StatusOK, hits)
		return
	}
	for _, d := range s.prov.dashboards {
		if !strings.Contains(strings.ToLower(d.title), strings.ToLower(q.Get("query"))) {
			continue
		}
		if !hasAll(d.tags, q["tag"]) {
			continue
		}
		if uids := q["dashboardUIDs"]; len(uids) > 0 && !slices.Contains(uids, d.uid) {
			continue
		}
		hits = append(hits, map[string]any{
			"id": d.id, "uid": d.uid, "title": d.title, "type": "dash-db",
			"uri": "db/" + slug(d.title), "url": dashboardURL(d), "slug": "",
			"tags": nonNil(d.tags), "isStarred": false, "folderTitle": d.folder,
		})
	}
	writeJSON(w, http.StatusOK, hits)
}

func (s *server) dashboardByUID(w http.ResponseWriter, r *http.Request) {
	for _, d := range s.prov.dashboards {
		if d.uid == r.PathValue("uid") {
			writeJSON(w, http.StatusOK, dashboardAnswer(d))
			return
		}
	}
	writeJSON(w, http.StatusNotFound, map[string]string{"message": "Dashboard not found"})
}

// home is the dashboard of GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH.
func (s *server) home(w http.ResponseWriter, _ *http.Request) {
	for _, d := range s.prov.dashboards {
		if s.homePath != "" && filepath.Base(d.file) == filepath.Base(s.homePath) {
			writeJSON(w, http.StatusOK, dashboardAnswer(d))
			return
		}
	}
	writeJSON(w, http.StatusNotFound, map[string]string{"message": "no home dashboard: GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH names no provisioned dashboard"})
}

func dashboardAnswer(d dashboard) map[string]any {
	return map[string]any{
		"dashboard": d.model,
		"meta": map[string]any{
			"type": "db", "slug": slug(d.title), "url": dashboardURL(d),
			"canSave": false, "canEdit": false, "canAdmin": false, "canStar": false,
			"provisioned": true, "provisionedExternalId": filepath.Base(d.file),
			"folderTitle": d.folder,
		},
	}
}

func (s *server) datasources(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, nonNil(s.prov.datasources))
}

func (s *server) datasourceByUID(w http.ResponseWriter, r *http.Request) {
	if ds, ok := s.datasource(r.PathValue("uid")); ok {
		writeJSON(w, http.StatusOK, ds)
		return
	}
	writeJSON(w, http.StatusNotFound, map[string]string{"message": "Data source not found"})
}

func (s *server) datasource(uid string) (datasource, bool) {
	i := slices.IndexFunc(s.prov.datasources, func(ds datasource) bool { return ds.UID == uid })
	if i < 0 {
		return datasource{}, false
	}
	return s.prov.datasources[i], true
}

// proxy forwards a request to a data source's URL, the rest of the path
// and the query appended, as Grafana's data source proxy does; the
// caller's cookies and credentials are not passed on.
func (s *server) proxy(w http.ResponseWriter, r *http.Request) {
	ds, ok := s.datasource(r.PathValue("uid"))
	if !ok || ds.Access != "proxy" {
		writeJSON(w, http.StatusNotFound, map[string]string{"message": "Unable to find datasource"})
		return
	}
	target, err := url.Parse(ds.URL)
	if err != nil {
		writeJSON(w, http.StatusBadGateway, map[string]string{"message": "data source URL: " + err.Error()})
		return
	}
	rest := r.PathValue("path")
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.URL.Path = strings.TrimSuffix(target.Path, "/") + "/" + rest
			pr.Out.URL.RawPath = ""
			pr.Out.Header.Del("Cookie")
			pr.Out.Header.Del("Authorization")
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			s.logger.Warn("data source proxy", "datasource", ds.UID, "err", err)
			writeJSON(w, http.StatusBadGateway, map[string]string{"message": "data source unreachable"})
		},
	}
	rp.ServeHTTP(w, r)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // the client has gone: nothing to do
}

var notSlug = regexp.MustCompile(`[^a-z0-9]+`)

func slug(title string) string {
	return strings.Trim(notSlug.ReplaceAllString(strings.ToLower(title), "-"), "-")
}

func dashboardURL(d dashboard) string {
	return "/d/" + d.uid + "/" + slug(d.title)
}

func hasAll(have, want []string) bool {
	for _, t := range want {
		if !slices.Contains(have, t) {
			return false
		}
	}
	return true
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
