"""TLS, client certificates and basic auth on the daemon's endpoints, with real handshakes."""
import base64
import datetime
import ssl
import urllib.error
import urllib.parse
import urllib.request
import ipaddress

import bcrypt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from exporter.config import WebConfig
from exporter.export.server import HTTPServer, Published


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _write(path, key, cert):
    path.with_suffix(".key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                           serialization.NoEncryption()))
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(path.with_suffix(".crt")), str(path.with_suffix(".key"))


def _cert(subject, key, issuer, issuer_key, *, ca=False, san=None, client=False):
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
         .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if san:
        b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(san))]), critical=False)
    if client:
        b = b.add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca_key = _key()
    ca = _cert("test-ca", ca_key, "test-ca", ca_key, ca=True)
    ca_crt, _ = _write(d / "ca", ca_key, ca)
    srv_key = _key()
    srv_crt, srv_keyf = _write(d / "server", srv_key, _cert("127.0.0.1", srv_key, "test-ca", ca_key, san="127.0.0.1"))
    cli_key = _key()
    cli_crt, cli_keyf = _write(d / "client", cli_key, _cert("scraper", cli_key, "test-ca", ca_key, client=True))
    return {"ca": ca_crt, "server": (srv_crt, srv_keyf), "client": (cli_crt, cli_keyf)}


def serve(web):
    pub = Published(lambda: b"vllm_drift_up 1\n")
    pub.ready = True
    srv = HTTPServer("127.0.0.1:0", pub, web)
    srv.start()
    return srv


def call(url, *, auth=None, ctx=None):
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=5, context=ctx) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()


def test_basic_auth_on_every_endpoint():
    srv = serve(WebConfig(basic_auth_users={"admin": HASH}))
    base = f"http://127.0.0.1:{srv.port}"
    try:
        for path in ("/metrics", "/api/v1/findings", "/api/v1/targets", "/-/ready", "/"):
            code, _, headers = call(base + path)
            assert code == 401 and headers["WWW-Authenticate"].startswith("Basic"), path
            assert call(base + path, auth=("admin", "wrong"))[0] == 401
            assert call(base + path, auth=("nobody", "s3cret"))[0] == 401
            assert call(base + path, auth=("admin", "s3cret"))[0] == 200, path
        assert call(base + "/metrics", auth=("admin", "s3cret"))[1] == b"vllm_drift_up 1\n"
        assert call(base + "/-/healthy")[0] == 200   # left open by default
    finally:
        srv.stop()
    srv = serve(WebConfig(basic_auth_users={"admin": HASH}, open_health=False))
    try:
        assert call(f"http://127.0.0.1:{srv.port}/-/healthy")[0] == 401
    finally:
        srv.stop()


def test_malformed_authorization_headers_are_refused():
    # the loader refuses a non-bcrypt value (test_config); the server must still not crash on one
    srv = serve(WebConfig.model_construct(basic_auth_users={"admin": HASH, "broken": "not-a-bcrypt-hash"}))
    base = f"http://127.0.0.1:{srv.port}/metrics"
    try:
        for header in ("Basic !!!", "Bearer x", "Basic " + base64.b64encode(b"no-colon").decode(), "Basic "):
            req = urllib.request.Request(base, headers={"Authorization": header})
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=5)
            assert e.value.code == 401
        assert call(base, auth=("broken", "x"))[0] == 401
    finally:
        srv.stop()


def test_tls_handshake_and_client_certificates(pki):
    srv = serve(WebConfig(tls_cert_file=pki["server"][0], tls_key_file=pki["server"][1]))
    url = f"https://127.0.0.1:{srv.port}/metrics"
    try:
        ctx = ssl.create_default_context(cafile=pki["ca"])
        assert call(url, ctx=ctx)[0] == 200
        with pytest.raises(urllib.error.URLError):   # a client that does not trust our CA refuses
            call(url, ctx=ssl.create_default_context())
        with pytest.raises((urllib.error.URLError, ConnectionError)):   # plain HTTP to the TLS port
            call(f"http://127.0.0.1:{srv.port}/metrics")
    finally:
        srv.stop()
    srv = serve(WebConfig(tls_cert_file=pki["server"][0], tls_key_file=pki["server"][1], client_ca_file=pki["ca"]))
    url = f"https://127.0.0.1:{srv.port}/metrics"
    try:
        ctx = ssl.create_default_context(cafile=pki["ca"])
        with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError)):
            call(url, ctx=ctx)    # no client certificate
        ctx.load_cert_chain(*pki["client"])
        assert call(url, ctx=ctx)[0] == 200
    finally:
        srv.stop()


def test_tls_and_auth_together(pki):
    srv = serve(WebConfig(tls_cert_file=pki["server"][0], tls_key_file=pki["server"][1], basic_auth_users={"admin": HASH}))
    url = f"https://127.0.0.1:{srv.port}/api/v1/findings"
    ctx = ssl.create_default_context(cafile=pki["ca"])
    try:
        assert call(url, ctx=ctx)[0] == 401
        assert call(url, ctx=ctx, auth=("admin", "s3cret"))[0] == 200
    finally:
        srv.stop()


# ---- a real daemon: secrets stay out of the logs, request parameters never become targets ----
PASSWORD = "Pa55-w0rd-only-in-this-test"


def test_secrets_never_logged(tmp_path, cli_env):
    """Failed and successful logins, a good reload, a reload with broken YAML, and a reload with a
    plaintext password where the hash belongs: stderr never holds the password, the hash, the
    Authorization header, or the mistaken plaintext."""
    import signal
    import time

    import loopback
    from daemons import Serve, samples, wait_for

    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    plaintext = "plain-text-mistake-4242"
    with loopback.Site(loopback.static({"/metrics": b"# TYPE node_load1 gauge\nnode_load1 1\n"})) as site:
        good = (f"scrape: {{interval: 1s, timeout: 1s}}\nevaluation: {{interval: 1s, window: 60s}}\n"
                f"targets:\n  - url: {site.url}\nweb:\n  basic_auth_users:\n    admin: '{hashed}'\n")
        cfg = tmp_path / "c.yaml"
        cfg.write_text(good)
        d = Serve(cfg, cli_env, tmp_path)
        auth = ("admin", PASSWORD)
        try:
            wait_for(lambda: call(d.url + "/-/ready", auth=auth)[0] == 200)
            for creds in (None, ("admin", "wrong-" + PASSWORD), ("nobody", PASSWORD), auth, auth):
                call(d.url + "/metrics", auth=creds)
            assert call(d.url + "/metrics", auth=auth)[0] == 200
            assert call(d.url + "/metrics", auth=("admin", "wrong"))[0] == 401
            reloads = lambda: samples(call(d.url + "/metrics", auth=auth)[1].decode(), "vllm_drift_config_reloads_total").get("", 0)
            failures = lambda: samples(call(d.url + "/metrics", auth=auth)[1].decode(),
                                       "vllm_drift_config_reload_failures_total").get("", 0)
            d.proc.send_signal(signal.SIGHUP)                          # a good reload
            wait_for(lambda: reloads() >= 1)
            cfg.write_text(good.replace(f"admin: '{hashed}'", f"admin: '{hashed}\n  oops: ["))
            d.proc.send_signal(signal.SIGHUP)                          # broken YAML around the hash
            wait_for(lambda: failures() >= 1)
            cfg.write_text(good.replace(hashed, plaintext))
            d.proc.send_signal(signal.SIGHUP)                          # a password where the hash goes
            wait_for(lambda: failures() >= 2)
            assert call(d.url + "/metrics", auth=auth)[0] == 200      # the last good config holds
            time.sleep(0.5)
        finally:
            assert d.stop() == 0
    log = d.log()
    assert "config reload failed" in log and "is not a bcrypt hash" in log and "config reloaded" in log
    for secret in (PASSWORD, hashed, hashed[7:29], plaintext, base64.b64encode(f"admin:{PASSWORD}".encode()).decode(),
                   base64.b64encode(f"admin:wrong-{PASSWORD}".encode()).decode()):
        assert secret not in log, secret


def test_request_parameters_never_make_the_daemon_fetch(tmp_path, cli_env):
    """There is no /probe: a URL in a query parameter, a path, a header or a POST body of any
    endpoint is never fetched. A loopback server stands where the parameter points and must
    see no request at all, while the configured target is scraped normally."""
    import http.client
    import time

    import loopback
    from daemons import Serve, samples, wait_for

    body = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 1\n"
    with loopback.Site(loopback.static({"/metrics": body})) as target, \
            loopback.Site(loopback.static({"/metrics": body})) as bait:
        cfg = tmp_path / "c.yaml"
        cfg.write_text("scrape: {interval: 0.5s, timeout: 0.5s}\nevaluation: {interval: 1s, window: 60s}\n"
                       f"targets:\n  - url: {target.url}\n")
        d = Serve(cfg, cli_env, tmp_path)
        try:
            d.wait_ready()
            b = bait.url
            paths = [f"/metrics?target={b}", f"/metrics?target={b}/metrics&module=vllm",
                     f"/api/v1/findings?target={b}", f"/api/v1/targets?url={b}", f"/probe?target={b}",
                     f"/-/reload?target={b}", f"/?target={b}", f"/{b}/metrics", f"/metrics/{b}",
                     "/api/v1/findings?target=" + urllib.parse.quote(b, safe="")]
            for path in paths:
                for method in ("GET", "POST", "HEAD"):
                    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=5)
                    conn.request(method, path, body=f"target={b}" if method == "POST" else None,
                                 headers={"X-Target": b, "Host": b.split("//")[1]})
                    conn.getresponse().read()
                    conn.close()
            n = len(target.requests)
            wait_for(lambda: len(target.requests) >= n + 2, timeout=10)   # two more scrape cycles
            time.sleep(0.5)
            up = samples(d.metrics(), "vllm_drift_target_up")
            assert list(up) == [f'{{target="{target.url}"}}'], up
            assert b not in d.metrics() and b not in get_findings(d)
        finally:
            assert d.stop() == 0
        assert bait.requests == [], bait.requests


def get_findings(d) -> str:
    with urllib.request.urlopen(d.url + "/api/v1/findings", timeout=5) as r:
        return r.read().decode()


def test_stalled_scraper_connections_do_not_block_metrics():
    """A hostile scraper opens hundreds of connections and stalls mid-request (slow loris on our
    side): /metrics answers other clients as fast as before (each connection has its own thread,
    dropped after the handler's idle timeout)."""
    import socket
    import time

    srv = serve(WebConfig())
    url = f"http://127.0.0.1:{srv.port}/metrics"

    def worst(n=15):
        out = []
        for _ in range(n):
            t = time.perf_counter()
            assert call(url)[0] == 200
            out.append(time.perf_counter() - t)
        return max(out)

    socks = []
    try:
        base = worst()
        for _ in range(300):
            c = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
            c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")       # never finishes its headers
            socks.append(c)
        stalled = worst()
        assert stalled < max(10 * base, 0.25), (base, stalled)
    finally:
        for c in socks:
            c.close()
        srv.stop()


def test_failed_handshakes_log_one_line_not_a_traceback(pki, capfd):
    """Plain HTTP to the TLS port and a client that distrusts our CA: each failure is one short
    line, never a stack trace a hostile client could use to flood the log."""
    import socket

    srv = serve(WebConfig(tls_cert_file=pki["server"][0], tls_key_file=pki["server"][1]))
    try:
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as c:
                c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                c.recv(100)
            with pytest.raises(urllib.error.URLError):
                urllib.request.urlopen(f"https://127.0.0.1:{srv.port}/metrics", timeout=5,
                                       context=ssl.create_default_context())
        assert call(f"https://127.0.0.1:{srv.port}/metrics", ctx=ssl.create_default_context(cafile=pki["ca"]))[0] == 200
    finally:
        srv.stop()
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "Exception occurred during processing" not in out + err, err[-2000:]
    assert (out + err).count("client connection failed") >= 3
