"""Schemathesis hooks of scripts/schemathesis.sh (loaded as SCHEMATHESIS_HOOKS).

not_a_server_error_but_501 is schemathesis's not_a_server_error except that
501 passes: the specs declare the E2B routes sandboxd does not serve yet (and
features of served routes, such as MCP sandboxes) with a 501 answer.
"""

import schemathesis
from schemathesis.checks import not_a_server_error


@schemathesis.check
def not_a_server_error_but_501(ctx, response, case):
    if response.status_code == 501:
        return None
    return not_a_server_error(ctx, response, case)
