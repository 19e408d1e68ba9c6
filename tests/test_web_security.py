"""TLS, client certificates and basic auth on the daemon's endpoints, with real handshakes."""
import base64
import datetime
import ssl
import urllib.error
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
    srv = serve(WebConfig(basic_auth_users={"admin": HASH, "broken": "not-a-bcrypt-hash"}))
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
