#include "hostd-b-private.h"
