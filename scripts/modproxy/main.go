// Command modproxy serves the repository's root module from git history
// through a file-system module proxy (GOPROXY=file://DIR), so that the
// nested modules (prom/, sim/, bench/, ...) can require the root module by a
// real version, without a replace directive, while the module is not
// published anywhere. It is used by scripts/pin-root.sh and
// scripts/modcheck.sh.
//
// Usage:
//
//	modproxy add -repo DIR -dir PROXYDIR -rev REV [-v]
//	modproxy add -repo DIR -dir PROXYDIR -version VERSION [-v]
//	modproxy pins -repo DIR
//	modproxy work -repo DIR
//	modproxy workcopy -repo DIR -out DIR
//
// add writes the root module (the go.mod at the top of the repository) at a
// commit into PROXYDIR as the module proxy protocol lays it out (go help
// goproxy): @v/list, VERSION.info, VERSION.mod and VERSION.zip, and prints
// the version. With -rev, the version is the one the go command computes for
// that commit: its canonical tag if it has one, otherwise a pseudo-version
// (v0.0.0-yyyymmddhhmmss-abcdef123456 in a repository without tags). With
// -version, the commit is the one the version names, and add fails, as the go
// command would, when the version does not match that commit (timestamp,
// revision, base tag). With -v, add also prints the two go.sum lines of the
// version to standard error.
//
// The zip holds what the go command puts in it: the files of `git archive`
// at that commit, less subdirectories with their own go.mod, vendor
// directories and whatever else golang.org/x/mod/zip leaves out (the go
// command uses the same package).
//
// pins prints one line per nested module (a go.mod below the top, tracked or
// not ignored) that mentions the root module: its directory relative to the
// top, the version it requires ("-" when none) and the target of a replace
// directive for the root module ("-" when none).
//
// work prints one line per replace directive for the root module in the
// go.work at the top (nothing when there is none): the version it replaces
// ("-" for all versions) and its target.
//
// workcopy copies the go.work at the top (and its go.work.sum) into another
// directory, with every relative path in it made absolute, so that the go
// command can use the workspace (GOWORK=DIR/go.work) without writing to the
// repository's go.work.sum.
package main

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/sumdb/dirhash"
	modzip "golang.org/x/mod/zip"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "add":
		err = runAdd(os.Args[2:])
	case "pins":
		err = runPins(os.Args[2:])
	case "work":
		err = runWork(os.Args[2:])
	case "workcopy":
		err = runWorkCopy(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "modproxy:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, `usage:
  modproxy add -repo DIR -dir PROXYDIR (-rev REV | -version VERSION) [-v]
  modproxy pins -repo DIR
  modproxy work -repo DIR
  modproxy workcopy -repo DIR -out DIR`)
	os.Exit(2)
}

func runAdd(args []string) error {
	fl := flag.NewFlagSet("add", flag.ExitOnError)
	repo := fl.String("repo", ".", "the git work tree whose top holds the root module's go.mod")
	dir := fl.String("dir", "", "the proxy directory to write into (created if missing)")
	rev := fl.String("rev", "", "the commit to serve, at the version the go command would give it")
	version := fl.String("version", "", "the version to serve (a pseudo-version or a tag)")
	verbose := fl.Bool("v", false, "print the go.sum lines of the version to standard error")
	_ = fl.Parse(args)
	if *dir == "" || (*rev == "") == (*version == "") || fl.NArg() != 0 {
		usage()
	}
	r := &repoDir{dir: *repo}
	var (
		m   module.Version
		err error
	)
	if *rev != "" {
		m, err = r.versionOf(*rev)
	} else {
		m, err = r.check(*version)
	}
	if err != nil {
		return err
	}
	zipSum, modSum, err := r.write(*dir, m)
	if err != nil {
		return err
	}
	if *verbose {
		fmt.Fprintf(os.Stderr, "%s %s %s\n%s %s/go.mod %s\n", m.Path, m.Version, zipSum, m.Path, m.Version, modSum)
	}
	fmt.Println(m.Version)
	return nil
}

func runPins(args []string) error {
	fl := flag.NewFlagSet("pins", flag.ExitOnError)
	repo := fl.String("repo", ".", "the git work tree whose top holds the root module's go.mod")
	_ = fl.Parse(args)
	if fl.NArg() != 0 {
		usage()
	}
	pins, err := nestedPins(*repo)
	if err != nil {
		return err
	}
	for _, p := range pins {
		fmt.Println(p.dir, dash(p.version), dash(p.replace))
	}
	return nil
}

func runWork(args []string) error {
	fl := flag.NewFlagSet("work", flag.ExitOnError)
	repo := fl.String("repo", ".", "the git work tree whose top holds the root module's go.mod")
	_ = fl.Parse(args)
	if fl.NArg() != 0 {
		usage()
	}
	reps, err := workReplaces(*repo)
	if err != nil {
		return err
	}
	for _, r := range reps {
		fmt.Println(dash(r.Old.Version), r.New.String())
	}
	return nil
}

func runWorkCopy(args []string) error {
	fl := flag.NewFlagSet("workcopy", flag.ExitOnError)
	repo := fl.String("repo", ".", "the git work tree whose top holds go.work")
	out := fl.String("out", "", "the directory to write go.work and go.work.sum into")
	_ = fl.Parse(args)
	if *out == "" || fl.NArg() != 0 {
		usage()
	}
	return copyWork(*repo, *out)
}

// copyWork copies repo's go.work and go.work.sum into the directory out, with
// the relative paths of use and replace directives made absolute.
func copyWork(repo, out string) error {
	top, err := filepath.Abs(repo)
	if err != nil {
		return err
	}
	name := filepath.Join(top, "go.work")
	data, err := os.ReadFile(name)
	if err != nil {
		return err
	}
	wf, err := modfile.ParseWork(name, data, nil)
	if err != nil {
		return err
	}
	abs := func(p string) string {
		if filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(top, filepath.FromSlash(p))
	}
	// Drop first, then add: dropping clears the directive in place.
	var uses []modfile.Use
	for _, u := range wf.Use {
		uses = append(uses, *u)
	}
	var reps []modfile.Replace
	for _, r := range wf.Replace {
		if r.New.Version == "" && modfile.IsDirectoryPath(r.New.Path) {
			reps = append(reps, *r)
		}
	}
	for _, u := range uses {
		if err := wf.DropUse(u.Path); err != nil {
			return err
		}
	}
	for _, r := range reps {
		if err := wf.DropReplace(r.Old.Path, r.Old.Version); err != nil {
			return err
		}
	}
	wf.Cleanup()
	for _, u := range uses {
		if err := wf.AddUse(abs(u.Path), u.ModulePath); err != nil {
			return err
		}
	}
	for _, r := range reps {
		if err := wf.AddReplace(r.Old.Path, r.Old.Version, abs(r.New.Path), ""); err != nil {
			return err
		}
	}
	wf.Cleanup()
	if err := os.MkdirAll(out, 0o777); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(out, "go.work"), modfile.Format(wf.Syntax)); err != nil {
		return err
	}
	sum, err := os.ReadFile(filepath.Join(top, "go.work.sum"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(out, "go.work.sum"), sum)
}

// workReplaces returns the replace directives for the root module in the
// go.work at the top of repo (none when there is no go.work).
func workReplaces(repo string) ([]*modfile.Replace, error) {
	rootPath, err := modulePathOf(filepath.Join(repo, "go.mod"))
	if err != nil {
		return nil, err
	}
	name := filepath.Join(repo, "go.work")
	data, err := os.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	wf, err := modfile.ParseWork(name, data, nil)
	if err != nil {
		return nil, err
	}
	var reps []*modfile.Replace
	for _, r := range wf.Replace {
		if r.Old.Path == rootPath {
			reps = append(reps, r)
		}
	}
	return reps, nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// A pin is a nested module's requirement of the root module.
type pin struct {
	dir     string // relative to the top, slash-separated
	version string // required version, "" when none
	replace string // target of a replace directive for the root module, "" when none
}

// nestedPins lists the nested modules that mention the root module, sorted
// by directory.
func nestedPins(repo string) ([]pin, error) {
	rootPath, err := modulePathOf(filepath.Join(repo, "go.mod"))
	if err != nil {
		return nil, err
	}
	out, err := git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", ":(glob)**/go.mod")
	if err != nil {
		return nil, err
	}
	var pins []pin
	for _, name := range strings.Split(string(out), "\x00") {
		d := path.Dir(name)
		if name == "" || d == "." || excludedDir(d) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(repo, filepath.FromSlash(name)))
		if errors.Is(err, fs.ErrNotExist) {
			continue // tracked but deleted in the work tree
		}
		if err != nil {
			return nil, err
		}
		f, err := modfile.Parse(name, data, nil)
		if err != nil {
			return nil, err
		}
		p := pin{dir: d}
		mentions := false
		for _, r := range f.Require {
			if r.Mod.Path == rootPath {
				p.version, mentions = r.Mod.Version, true
			}
		}
		for _, r := range f.Replace {
			if r.Old.Path == rootPath {
				p.replace, mentions = r.New.String(), true
			}
		}
		if mentions {
			pins = append(pins, p)
		}
	}
	slices.SortFunc(pins, func(a, b pin) int { return strings.Compare(a.dir, b.dir) })
	return pins, nil
}

// excludedDir reports whether a go.mod in directory d (relative to the top)
// is test data or vendored code rather than a nested module of the project.
func excludedDir(d string) bool {
	for _, elem := range strings.Split(d, "/") {
		if elem == "testdata" || elem == "vendor" || strings.HasPrefix(elem, ".") || strings.HasPrefix(elem, "_") {
			return true
		}
	}
	return false
}

func modulePathOf(goMod string) (string, error) {
	data, err := os.ReadFile(goMod)
	if err != nil {
		return "", err
	}
	p := modfile.ModulePath(data)
	if p == "" {
		return "", fmt.Errorf("%s: no module directive", goMod)
	}
	return p, nil
}

// repoDir is a git work tree whose top holds the root module.
type repoDir struct {
	dir string
}

// commit describes one commit of the repository.
type commit struct {
	hash string
	time time.Time
	tags []string // tags that point at the commit
}

func (r *repoDir) commit(rev string) (commit, error) {
	out, err := git(r.dir, "rev-parse", "--verify", "--quiet", "--end-of-options", rev+"^{commit}")
	if err != nil {
		if shallow, _ := git(r.dir, "rev-parse", "--is-shallow-repository"); strings.TrimSpace(string(shallow)) == "true" {
			return commit{}, fmt.Errorf("%q is not a commit of this repository (the clone is shallow: git fetch --unshallow)", rev)
		}
		return commit{}, fmt.Errorf("%q is not a commit of this repository", rev)
	}
	c := commit{hash: strings.TrimSpace(string(out))}
	// The go command takes the committer time.
	out, err = git(r.dir, "log", "-1", "--format=%ct", c.hash)
	if err != nil {
		return commit{}, err
	}
	secs, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		return commit{}, fmt.Errorf("commit time of %s: %v", c.hash, err)
	}
	c.time = time.Unix(secs, 0).UTC()
	out, err = git(r.dir, "tag", "--points-at", c.hash)
	if err != nil {
		return commit{}, err
	}
	c.tags = strings.Fields(string(out))
	return c, nil
}

// rootPathAt returns the root module's go.mod and module path at a commit.
func (r *repoDir) rootPathAt(hash string) ([]byte, string, error) {
	data, err := git(r.dir, "cat-file", "blob", hash+":go.mod")
	if err != nil {
		return nil, "", fmt.Errorf("commit %s has no go.mod at the top of the repository", hash)
	}
	p := modfile.ModulePath(data)
	if p == "" {
		return nil, "", fmt.Errorf("go.mod at commit %s has no module directive", hash)
	}
	return data, p, nil
}

// tagVersion returns the version a tag gives the root module ("" when the
// tag is not a canonical semantic version usable by a module path without a
// major version suffix), as cmd/go's tagToVersion does for such a path.
func tagVersion(tag string) string {
	if module.IsPseudoVersion(tag) || semver.Canonical(tag) != tag {
		return ""
	}
	if m := semver.Major(tag); m != "v0" && m != "v1" {
		return "" // would need a /vN module path (the root has a go.mod, so no +incompatible)
	}
	return tag
}

// versionOf returns the root module at rev, with the version the go command
// computes for that commit.
func (r *repoDir) versionOf(rev string) (module.Version, error) {
	c, err := r.commit(rev)
	if err != nil {
		return module.Version{}, err
	}
	_, modPath, err := r.rootPathAt(c.hash)
	if err != nil {
		return module.Version{}, err
	}
	// A canonical tag on the commit itself is its version.
	best := ""
	for _, t := range c.tags {
		if v := tagVersion(t); v != "" && semver.Compare(v, best) > 0 {
			best = v
		}
	}
	if best != "" {
		return module.Version{Path: modPath, Version: best}, nil
	}
	// Otherwise a pseudo-version above the highest tag among its ancestors.
	out, err := git(r.dir, "for-each-ref", "--format=%(refname)", "--merged="+c.hash, "refs/tags/")
	if err != nil {
		return module.Version{}, err
	}
	base := ""
	for _, ref := range strings.Fields(string(out)) {
		if v := tagVersion(strings.TrimPrefix(ref, "refs/tags/")); v != "" && semver.Compare(v, base) > 0 {
			base = v
		}
	}
	return module.Version{Path: modPath, Version: module.PseudoVersion("v0", base, c.time, c.hash[:12])}, nil
}

// check returns the root module at version, after checking, as the go
// command does, that the version names a commit of the repository.
func (r *repoDir) check(version string) (module.Version, error) {
	if !semver.IsValid(version) || semver.Canonical(version) != version {
		return module.Version{}, fmt.Errorf("%q is not a canonical module version", version)
	}
	if !module.IsPseudoVersion(version) {
		// A release: the tag of that name.
		c, err := r.commit("refs/tags/" + version)
		if err != nil {
			return module.Version{}, fmt.Errorf("version %s: no tag %s in this repository", version, version)
		}
		_, modPath, err := r.rootPathAt(c.hash)
		if err != nil {
			return module.Version{}, err
		}
		return module.Version{Path: modPath, Version: version}, nil
	}
	rev, err := module.PseudoVersionRev(version)
	if err != nil {
		return module.Version{}, err
	}
	c, err := r.commit(rev)
	if err != nil {
		return module.Version{}, fmt.Errorf("pseudo-version %s names commit %s: %v", version, rev, err)
	}
	_, modPath, err := r.rootPathAt(c.hash)
	if err != nil {
		return module.Version{}, err
	}
	if short := c.hash[:12]; rev != short {
		return module.Version{}, fmt.Errorf("pseudo-version %s: revision %s is not the 12-character short hash %s", version, rev, short)
	}
	t, err := module.PseudoVersionTime(version)
	if err != nil {
		return module.Version{}, err
	}
	if !t.Equal(c.time) {
		return module.Version{}, fmt.Errorf("pseudo-version %s does not match the time of commit %s (expected %s)",
			version, c.hash[:12], c.time.Format(module.PseudoVersionTimestampFormat))
	}
	base, err := module.PseudoVersionBase(version)
	if err != nil {
		return module.Version{}, err
	}
	if base == "" {
		if semver.Major(version) != "v0" {
			return module.Version{}, fmt.Errorf("pseudo-version %s: major version without preceding tag must be v0", version)
		}
	} else {
		// The base must be a tag on an ancestor of the commit.
		bc, err := r.commit("refs/tags/" + base)
		if err != nil {
			return module.Version{}, fmt.Errorf("pseudo-version %s: no tag %s for its base", version, base)
		}
		if _, err := git(r.dir, "merge-base", "--is-ancestor", bc.hash, c.hash); err != nil {
			return module.Version{}, fmt.Errorf("pseudo-version %s: tag %s is not an ancestor of commit %s", version, base, c.hash[:12])
		}
	}
	return module.Version{Path: modPath, Version: version}, nil
}

// write puts m into the proxy directory and returns the go.sum hashes of its
// zip and of its go.mod.
func (r *repoDir) write(dir string, m module.Version) (zipSum, modSum string, err error) {
	rev := m.Version
	if module.IsPseudoVersion(rev) {
		rev, _ = module.PseudoVersionRev(rev)
	} else {
		rev = "refs/tags/" + rev
	}
	c, err := r.commit(rev)
	if err != nil {
		return "", "", err
	}
	goMod, _, err := r.rootPathAt(c.hash)
	if err != nil {
		return "", "", err
	}
	escPath, err := module.EscapePath(m.Path)
	if err != nil {
		return "", "", err
	}
	escVers, err := module.EscapeVersion(m.Version)
	if err != nil {
		return "", "", err
	}
	vdir := filepath.Join(dir, filepath.FromSlash(escPath), "@v")
	if err := os.MkdirAll(vdir, 0o777); err != nil {
		return "", "", err
	}
	base := filepath.Join(vdir, escVers)

	// The zip: every file of the commit, as `git archive` gives them, less
	// what a module zip leaves out.
	files, err := r.archive(c.hash)
	if err != nil {
		return "", "", err
	}
	var buf bytes.Buffer
	if err := modzip.Create(&buf, m, files); err != nil {
		return "", "", err
	}
	if err := writeFile(base+".zip", buf.Bytes()); err != nil {
		return "", "", err
	}
	if err := writeFile(base+".mod", goMod); err != nil {
		return "", "", err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{m.Version, c.time})
	if err != nil {
		return "", "", err
	}
	if err := writeFile(base+".info", append(info, '\n')); err != nil {
		return "", "", err
	}
	if err := addToList(filepath.Join(vdir, "list"), m.Version); err != nil {
		return "", "", err
	}

	zipSum, err = dirhash.HashZip(base+".zip", dirhash.Hash1)
	if err != nil {
		return "", "", err
	}
	modSum, err = dirhash.Hash1([]string{"go.mod"}, func(string) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(goMod)), nil
	})
	if err != nil {
		return "", "", err
	}
	return zipSum, modSum, nil
}

// archive returns the files of the repository at a commit, as
// golang.org/x/mod/zip.CreateFromVCS (and the go command) read them: through
// `git archive`. CreateFromVCS itself is not used because it refuses linked
// work trees (git worktree), whose .git is a file.
func (r *repoDir) archive(hash string) ([]modzip.File, error) {
	// As in CreateFromVCS: no line-ending conversion on the way out.
	out, err := git(r.dir, "-c", "core.autocrlf=input", "-c", "core.eol=lf", "archive", "--format=zip", hash)
	if err != nil {
		return nil, err
	}
	zr, err := zip.NewReader(bytes.NewReader(out), int64(len(out)))
	if err != nil {
		return nil, err
	}
	var files []modzip.File
	for _, f := range zr.File {
		if strings.HasSuffix(f.Name, "/") {
			continue
		}
		files = append(files, zipFile{f})
	}
	return files, nil
}

// zipFile is a file of a `git archive` zip, as a module zip input.
type zipFile struct{ f *zip.File }

func (z zipFile) Path() string                 { return z.f.Name }
func (z zipFile) Lstat() (os.FileInfo, error)  { return z.f.FileInfo(), nil }
func (z zipFile) Open() (io.ReadCloser, error) { return z.f.Open() }

// addToList adds version to a proxy's @v/list file (one version a line).
func addToList(list, version string) error {
	data, err := os.ReadFile(list)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	versions := strings.Fields(string(data))
	if slices.Contains(versions, version) {
		return nil
	}
	versions = append(versions, version)
	semver.Sort(versions)
	return writeFile(list, []byte(strings.Join(versions, "\n")+"\n"))
}

// writeFile writes a file through a temporary name, so that a reader never
// sees half of it.
func writeFile(name string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(name), filepath.Base(name)+".tmp*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), name)
}

// git runs git in dir and returns its standard output.
func git(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
